"""Token sampling (greedy, temperature, top-k, top-p) and autoregressive generation.

Generation is generic over the model interface (`start_decode` / `decode_step`): the prompt
is observed token by token and new tokens are sampled from the logits each step returns.
One jitted step serves both phases (a forced prompt token or a sampled one), so it is traced
once per batch size. GPN / GPN+M / Gated DeltaNet decoding states are O(1) in the context
length; the Transformer++ KV cache is a fixed `max_seq_len` buffer, which bounds its context.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
# Above this the distribution is uniform to float32 precision: a larger value is a mistake.
MAX_TEMPERATURE = 1e4


def _real(x) -> bool:
    """A finite real number (bools are not)."""
    return isinstance(x, (int, float, np.number)) and not isinstance(x, bool) and np.isfinite(x)


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How the next token is picked. temperature 0 (or greedy=True) is argmax.

    top_k 0 and top_p 1.0 disable those filters; they apply after the temperature, top-k
    first (the usual order).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False

    def __post_init__(self):
        # Written so that NaN fails every check (a NaN temperature samples garbage).
        t, k, p = self.temperature, self.top_k, self.top_p
        if not (_real(t) and 0.0 <= t <= MAX_TEMPERATURE):
            raise ValueError(f"temperature must be a number in [0, {MAX_TEMPERATURE:g}], got {t}")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k < 2**31:
            raise ValueError(f"top_k must be an integer in [0, 2^31), got {k}")
        if not (_real(p) and 0.0 < p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {p}")

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0.0


def filter_logits(logits_BxV: Array, top_k: int = 0, top_p: float = 1.0) -> Array:
    """Sets logits outside the top-k / top-p (nucleus) set to -inf.

    top-p keeps the smallest set of most likely tokens whose probability reaches `top_p`
    (always at least the most likely token).
    """
    logits = logits_BxV.astype(jnp.float32)
    neg = jnp.finfo(jnp.float32).min
    if top_k and top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, neg, logits)
    if top_p < 1.0:
        order = jnp.argsort(-logits, axis=-1)
        sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass of strictly more likely tokens
        keep_sorted = before < top_p
        keep = (
            jnp.zeros_like(keep_sorted)
            .at[jnp.arange(logits.shape[0])[:, None], order]
            .set(keep_sorted)
        )
        logits = jnp.where(keep, logits, neg)
    return logits


def sample(rng: Array, logits_BxV: Array, cfg: SamplingConfig) -> Array:
    """Next tokens (B,) int32 from logits (B, V)."""
    if cfg.is_greedy:
        return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
    logits = filter_logits(logits_BxV.astype(jnp.float32) / cfg.temperature, cfg.top_k, cfg.top_p)
    return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)


def context_limit(model) -> int | None:
    """Most tokens a decoding state can observe after a fresh start (None: unbounded).

    Transformer++ puts BOS at cache position 0, leaving `max_seq_len - 1` slots.
    """
    max_len = getattr(model.config, "max_seq_len", None)
    return None if max_len is None else max_len - 1


@functools.lru_cache(maxsize=16)
def make_step(model, cfg: SamplingConfig):
    """Jitted `step(params, state, logits, rng, forced) -> (token, logits, state)`.

    `forced` (B,) int32: a prompt token to observe where >= 0, else the sampled token.
    """

    def step(params, state, logits, rng, forced):
        token = jnp.where(forced >= 0, forced, sample(rng, logits, cfg))
        logits, state = model.decode_step(params, state, token)
        return token, logits, state

    return jax.jit(step)


@functools.lru_cache(maxsize=16)
def _jitted_start(model):
    return jax.jit(model.start_decode, static_argnames="batch_size")


MAX_NEW_TOKENS = 1 << 24  # tokens one call may generate (each is one jitted step)
MAX_SAMPLES = 1 << 16  # sequences sampled at once (the batch of one step)
MAX_SAMPLED_TOKENS = 1 << 24  # num_samples x max_new_tokens: the ids held for the output


def check_generation(max_new_tokens: int, seed: int, num_samples: int) -> None:
    """One ValueError line for a generation length, seed or sample count out of range, or for
    samples x length past MAX_SAMPLED_TOKENS (checked before anything is allocated)."""
    checks = (
        ("max_new_tokens", max_new_tokens, 0, MAX_NEW_TOKENS),
        ("seed", seed, 0, 2**32 - 1),  # jax.random.PRNGKey keeps 32 bits
        ("num_samples", num_samples, 1, MAX_SAMPLES),
    )
    for name, value, low, high in checks:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r:.40}")
        if not low <= value <= high:
            raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    if num_samples * max_new_tokens > MAX_SAMPLED_TOKENS:
        raise ValueError(
            f"num_samples={num_samples} x --max_new_tokens={max_new_tokens} is "
            f"{num_samples * max_new_tokens} tokens to sample, over the limit of "
            f"{MAX_SAMPLED_TOKENS}; lower either"
        )


def generate(
    model,
    params,
    prompt: list[int],
    max_new_tokens: int,
    cfg: SamplingConfig = SamplingConfig(),
    *,
    seed: int = 0,
    num_samples: int = 1,
    eos_id: int | None = None,
) -> dict:
    """Samples `num_samples` continuations of `prompt` (token ids).

    Returns {'tokens': list of id lists (each cut after eos), 'prompt_logits': (P, V) float32
    logits predicting each prompt token (row t from prompt[:t]), 'truncated': bool (the
    model's context limit shortened the generation)}.
    """
    check_generation(max_new_tokens, seed, num_samples)
    limit = context_limit(model)
    P = len(prompt)
    truncated = False
    if limit is not None:
        if P > limit:
            raise ValueError(f"prompt of {P} tokens exceeds the model's context of {limit} tokens")
        # every token but the last generated one is observed
        if P + max_new_tokens - 1 > limit:
            max_new_tokens, truncated = limit - P + 1, True
    B = num_samples
    logits, state = _jitted_start(model)(params, batch_size=B)
    step = make_step(model, cfg)
    rng = jax.random.PRNGKey(seed)
    prompt_logits = []
    for t in prompt:
        prompt_logits.append(np.asarray(logits[0]))
        forced = jnp.full((B,), t, jnp.int32)
        _, logits, state = step(params, state, logits, rng, forced)
    out, done = [], np.zeros(B, bool)
    no_force = jnp.full((B,), -1, jnp.int32)
    for _ in range(max_new_tokens):
        rng, key = jax.random.split(rng)
        # (the state after the last token is never read, so past a Transformer's cache is fine)
        token, logits, state = step(params, state, logits, key, no_force)
        token = np.asarray(token)
        out.append(token)
        if eos_id is not None:
            done |= token == eos_id
            if done.all():
                break
    ids = np.stack(out, axis=1) if out else np.zeros((B, 0), np.int32)
    tokens = []
    for row in ids.tolist():
        if eos_id is not None and eos_id in row:
            row = row[: row.index(eos_id) + 1]
        tokens.append(row)
    V = logits.shape[-1]
    prompt_logits = np.stack(prompt_logits) if prompt_logits else np.zeros((0, V), np.float32)
    return {"tokens": tokens, "prompt_logits": prompt_logits, "truncated": truncated}
