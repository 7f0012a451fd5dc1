"""Token-level scoring for the lm-evaluation-harness adapter (`gpn_jax.eval.harness_lm`).

Three request kinds, each for every family, in plain token ids (no lm_eval import here):

* `loglikelihood`: (context, continuation) -> (sum of log p(continuation), greedy?).
  Recurrent families (GPN, GPN+M, Gated DeltaNet) stream each distinct context ONCE into a
  carry and score all its continuations from copies of that carry, so a multiple-choice
  question costs one context pass whatever its number of choices (`Stats.context_passes`
  counts them). The Transformer++ scores context + continuation in one window, cut from the
  left at `max_seq_len` as the harness cuts (`Stats.truncated` counts the cuts).
* `rolling`: the whole-document log-likelihood. Recurrent families stream the document
  window after window with the carry (no overlap, no re-read context); the Transformer++
  uses the harness's disjoint rolling windows (`lm_eval.utils.get_rolling_token_windows`
  logic, reimplemented in `transformer_windows` so this module stays lm_eval-free).
* `generate`: greedy or sampled tokens from a prompt until a stop string, eos or a limit.

Why windows of fixed sizes: XLA compiles one program per shape. A context of n tokens is
streamed as full `window`-token pieces, then the remainder as powers of two (n = 37,
window 32: 32 + 4 + 1), so the compile count is about log2(window) whatever the lengths,
and the carry after the last piece is exactly the carry after n tokens. Rows of a batch
share one length (contexts are grouped by exact length, then padded with dummy rows).
Continuations are right-padded: position t depends only on tokens < t, so the scored
positions never see the padding.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from gpn_jax.eval import lambada, sampling
from gpn_jax.eval.stream import jitted_token_losses


@dataclasses.dataclass
class Stats:
    """What the scorer did, for logs and tests."""

    context_passes: int = 0  # distinct contexts streamed into a carry (recurrent families)
    truncated: int = 0  # inputs cut from the left at the Transformer's context


def is_recurrent(model) -> bool:
    return model.init_state(1) is not None


def pieces(n: int, window: int) -> list[int]:
    """Lengths summing to n: full windows, then the remainder as descending powers of two."""
    out = [window] * (n // window)
    r = n % window
    while r:
        p = 1 << (r.bit_length() - 1)
        out.append(p)
        r -= p
    return out


@functools.lru_cache(maxsize=8)
def _continuation_scorer(model):
    """(params, carry, tokens (B, L)) -> log p of each token and greedy flags, both (B, L)."""

    def score(params, carry, tokens_BxL):
        logits, _ = model.logits(params, tokens_BxL, carry)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        ll = jnp.take_along_axis(logp, tokens_BxL[..., None], axis=-1)[..., 0]
        return ll, jnp.argmax(logits, axis=-1) == tokens_BxL

    return jax.jit(score)


def stream(model, params, tokens_BxL: np.ndarray, window: int, carry=None):
    """Per-token CE (B, L) float64 and the carry after all L tokens, `window` tokens at a time."""
    tokens_BxL = np.asarray(tokens_BxL, np.int32)
    carry = model.init_state(tokens_BxL.shape[0]) if carry is None else carry
    losses, lo = [], 0
    for n in pieces(tokens_BxL.shape[1], window):
        ce, carry = jitted_token_losses(model)(params, tokens_BxL[:, lo : lo + n], carry)
        losses.append(np.asarray(ce, np.float64))
        lo += n
    ce = np.concatenate(losses, axis=1) if losses else np.zeros((len(tokens_BxL), 0))
    return ce, carry


def _padded_len(n: int, multiple: int) -> int:
    return max(multiple, -(-n // multiple) * multiple)


def _rows(arrays: list[list[int]], batch: int, length: int) -> np.ndarray:
    """(batch, length) int32, row i = arrays[i] right-padded with 0; missing rows are 0."""
    out = np.zeros((batch, length), np.int32)
    for i, a in enumerate(arrays):
        out[i, : len(a)] = a
    return out


# ----------------------------------------------------------------------------- loglikelihood
def loglikelihood(model, params, pairs, batch_size, window, stats: Stats, pad_multiple=16):
    """[(log p(continuation | context), greedy?)] for (context ids, continuation ids) pairs.

    An empty context means a fresh sequence (the models' own start-of-sequence state).
    """
    if not is_recurrent(model):
        return _loglikelihood_windowed(model, params, pairs, batch_size, stats)
    by_context: dict[tuple, list[int]] = {}
    for i, (context, _) in enumerate(pairs):
        by_context.setdefault(tuple(context), []).append(i)
    contexts = sorted(by_context, key=len)
    results: list = [None] * len(pairs)
    lo = 0
    while lo < len(contexts):  # batches of equal-length contexts
        n = len(contexts[lo])
        group = [c for c in contexts[lo : lo + batch_size] if len(c) == n]
        lo += len(group)
        carry = _context_carry(model, params, group, batch_size, window, stats)
        jobs = [(row, i) for row, c in enumerate(group) for i in by_context[c]]
        for j in range(0, len(jobs), batch_size):
            chunk = jobs[j : j + batch_size]
            conts = [pairs[i][1] for _, i in chunk]
            _score_continuations(model, params, carry, chunk, conts, batch_size, pad_multiple,
                                 results)  # fmt: skip
    return results


def _context_carry(model, params, group, batch_size, window, stats: Stats):
    """The carry after each context of `group` (equal lengths), one row each, padded rows."""
    if not group[0]:
        return model.init_state(batch_size)  # empty context: nothing to read
    stats.context_passes += len(group)
    tokens = _rows([list(c) for c in group], batch_size, len(group[0]))
    tokens[len(group) :] = tokens[0]  # dummy rows: copies (any tokens would do)
    return stream(model, params, tokens, window)[1]


def _score_continuations(model, params, carry, chunk, conts, batch_size, pad_multiple, results):
    idx = np.zeros(batch_size, np.int32)
    idx[: len(chunk)] = [row for row, _ in chunk]
    rows = jax.tree.map(lambda a: a[idx], carry)
    L = _padded_len(max(len(c) for c in conts), pad_multiple)
    ll, greedy = jax.device_get(
        _continuation_scorer(model)(params, rows, _rows(conts, batch_size, L))
    )
    for r, ((_, i), cont) in enumerate(zip(chunk, conts, strict=True)):
        k = len(cont)
        results[i] = (float(np.sum(ll[r, :k], dtype=np.float64)), bool(greedy[r, :k].all()))


def _loglikelihood_windowed(model, params, pairs, batch_size, stats: Stats):
    """Transformer++: context + continuation in one window, the harness's left cut."""
    max_len = getattr(model.config, "max_seq_len", None)
    encoded = []
    for context, cont in pairs:
        tokens = list(context) + list(cont)
        cut = max_len is not None and len(tokens) > max_len
        tokens = tokens[-max_len:] if cut else tokens
        stats.truncated += int(cut)
        encoded.append(
            lambada.Encoded(np.asarray(tokens, np.int32), min(len(cont), len(tokens)), cut)
        )
    scored = lambada.score_encoded(model, params, encoded, batch_size)
    return [(-float(r["ce"].sum()), bool(r["correct"].all())) for r in scored]


# ----------------------------------------------------------------------------- rolling
def rolling(model, params, docs: list[list[int]], batch_size, window, bos_id: int):
    """Log-likelihood of every token of each document (position 0 from a fresh sequence)."""
    if not is_recurrent(model):
        return _rolling_windowed(model, params, docs, batch_size, bos_id)
    order = sorted(range(len(docs)), key=lambda i: len(docs[i]))
    out = [0.0] * len(docs)
    for lo in range(0, len(order), batch_size):
        idx = order[lo : lo + batch_size]
        L = _padded_len(max(len(docs[i]) for i in idx), window)
        # right padding: the padded tail is read after every real token, so it changes nothing
        ce, _ = stream(model, params, _rows([docs[i] for i in idx], batch_size, L), window)
        for r, i in enumerate(idx):
            out[i] = -float(ce[r, : len(docs[i])].sum())
    return out


def transformer_windows(tokens: list[int], max_len: int, prefix: int):
    """Disjoint (context, predicted) windows, as `get_rolling_token_windows(context_len=1)`
    followed by `make_disjoint_window` give them: each window predicts up to `max_len` new
    tokens after one token of context (the prefix token for the first)."""
    out, done = [], 0
    while done < len(tokens):
        n = min(max_len, len(tokens) - done)
        context = [prefix] if done == 0 else [tokens[done - 1]]
        out.append((context, tokens[done : done + n]))
        done += n
    return out


def _rolling_windowed(model, params, docs, batch_size, bos_id):
    """Transformer++: the harness's rolling windows over `max_seq_len - 1` predicted tokens
    (its BOS takes the remaining position). The first window's context is the model's own
    BOS, so it reads just the predicted tokens."""
    L = model.config.max_seq_len
    encoded, owner = [], []
    for d, tokens in enumerate(docs):
        for i, (context, pred) in enumerate(transformer_windows(tokens, L - 1, bos_id)):
            window = pred if i == 0 else context + pred
            encoded.append(lambada.Encoded(np.asarray(window, np.int32), len(pred), False))
            owner.append(d)
    out = [0.0] * len(docs)
    for d, r in zip(owner, lambada.score_encoded(model, params, encoded, batch_size), strict=True):
        out[d] -= float(r["ce"].sum())
    return out


# ----------------------------------------------------------------------------- generation
def generate(model, params, prompt: list[int], max_new: int, cfg: sampling.SamplingConfig,
             window: int, stop, stats: Stats, seed: int = 0, eos_id=None) -> list[int]:  # fmt: skip
    """Up to `max_new` token ids after `prompt`; `stop(ids) -> bool` ends generation early.

    Recurrent families read the prompt in windows and start decoding from the carry; the
    Transformer++ keeps the last `max_seq_len - 1 - max_new` prompt tokens (the harness's
    left cut, counted in `stats.truncated`) and observes them one by one.
    """
    limit = sampling.context_limit(model)
    if limit is not None:
        room = limit - max_new
        if room < 1:
            raise ValueError(
                f"max_gen_toks {max_new} leaves no room for a prompt in the model's context "
                f"of {limit} tokens"
            )
        if len(prompt) > room:
            prompt, stats.truncated = prompt[-room:], stats.truncated + 1
    step = sampling.make_step(model, cfg)
    if is_recurrent(model) and prompt:
        carry = stream(model, params, np.asarray([prompt], np.int32), window)[1]
        logits, state = _start(model)(params, carry)
        prompt = []
    else:
        logits, state = _start(model)(params, None)
    rng = jax.random.PRNGKey(seed)
    for t in prompt:
        _, logits, state = step(params, state, logits, rng, jnp.full((1,), t, jnp.int32))
    out, no_force = [], jnp.full((1,), -1, jnp.int32)
    for _ in range(max_new):
        rng, key = jax.random.split(rng)
        token, logits, state = step(params, state, logits, key, no_force)
        out.append(int(token[0]))
        if out[-1] == eos_id or stop(out):
            break
    return out


@functools.lru_cache(maxsize=8)
def _start(model):
    return jax.jit(lambda params, carry: model.start_decode(params, carry, batch_size=1))
