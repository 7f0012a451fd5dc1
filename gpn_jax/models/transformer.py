"""Transformer++ baseline: parameter specs (initialiser, shape, logical axes) plus the model's pure entry points.

Architecture (the "Transformer++" recipe): token embedding, then `n_layers` pre-norm blocks

    x = x + Wo · Attn(RoPE(Wq · rms(x)), RoPE(Wk · rms(x)), Wv · rms(x))    causal, multi-head
    x = x + W2 · (silu(W1 · rms(x)) * W3 · rms(x))                            SwiGLU MLP

then a final RMSNorm and the LM head (the transposed embedding when `tie_embeddings`, else
a separate (d, V) matrix). No biases anywhere. The training window's attention is
`jax.nn.dot_product_attention(..., is_causal=True)` with the implementation that
`attention_impl` picks: on a GPU with a 16-bit compute dtype, cuDNN's fused (flash) kernel,
which never stores the (T, T) scores; elsewhere XLA's, which does (jax's own default is
XLA's everywhere).

Initialisation (our choice, documented here):
  * embedding: N(0, 0.02);
  * input projections (Wq, Wk, Wv, W1, W3, untied head): LeCun-normal, std 1/sqrt(fan_in);
  * output projections (Wo, W2), which write into the residual stream:
    N(0, 0.02 / sqrt(2 * n_layers)) (GPT-2 style depth scaling, so the residual variance
    does not grow with depth);
  * norm weights: ones.

Window convention (see `gpn_jax.models.base`): position t of `tokens` is predicted from
`tokens[:, :t]`; nothing crosses windows. The inputs are `[bos, tokens[:, :-1]]`, so position
0 is predicted from BOS alone. `init_state` returns None and every carry passes through as is.

Numerics follow `gpn_jax.core.norms`: the residual stream, norms, RoPE and the softmax
statistics stay float32; matrices are cast once to `compute_dtype` and matmuls accumulate in
float32 (`mm`). Attention inputs are in `compute_dtype`.
"""

import functools
import logging
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from gpn_jax.core import loss as loss_lib
from gpn_jax.core.mlp import swiglu
from gpn_jax.core.norms import cast_matrices, mm, rms_norm
from gpn_jax.models import accounting
from gpn_jax.models.base import SpecModel, masked_mean
from gpn_jax.models.configs import TransformerConfig  # defined there, JAX-free
from gpn_jax.models.params import (
    EMBED,
    HEADS,
    VOCAB,
    lecun,
    ones,
    param,
    small,
    swiglu_specs,
)

Array = jax.Array


# ----------------------------------------------------------------------------- parameters


def param_specs(c: TransformerConfig) -> dict:
    """Every Transformer++ parameter: initialiser (module doc), shape, logical axes (attention
    projections split by whole heads, the MLP by d_ffn, the vocabulary; see
    `gpn_jax.models.params`)."""
    d, f, v = c.d_model, c.d_ffn, c.vocab_size
    out_init = nn.initializers.normal(stddev=0.02 / math.sqrt(2 * c.n_layers))
    tree = {"embed": param(small, (v, d), (VOCAB, EMBED))}
    for i in range(c.n_layers):
        tree[f"layer_{i}"] = {
            "attn_norm": param(ones, (d,)),
            "wq": param(lecun, (d, d), (EMBED, HEADS)),
            "wk": param(lecun, (d, d), (EMBED, HEADS)),
            "wv": param(lecun, (d, d), (EMBED, HEADS)),
            "wo": param(out_init, (d, d), (HEADS, EMBED)),
            "mlp_norm": param(ones, (d,)),
            **swiglu_specs(d, f, out_init),
        }
    tree["final_norm"] = param(ones, (d,))
    if not c.tie_embeddings:
        tree["head"] = param(lecun, (d, v), (EMBED, VOCAB))
    return tree


def weight_decay_mask(params) -> dict:
    """Decay matrices only (embedding, projections, head); never the norm weights."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


# ----------------------------------------------------------------------------- pure blocks
def rope_angles(positions: Array, head_dim: int, theta: float) -> tuple[Array, Array]:
    """cos, sin of shape positions.shape + (head_dim // 2,), float32."""
    inv_freq = theta ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    ang = positions.astype(jnp.float32)[..., None] * inv_freq
    return jnp.cos(ang), jnp.sin(ang)


def apply_rope(x_BxTxNxH: Array, cos_TxH2: Array, sin_TxH2: Array) -> Array:
    """Rotates the (first half, second half) feature pairs of each head, in float32."""
    x = x_BxTxNxH.astype(jnp.float32)
    x1, x2 = jnp.split(x, 2, axis=-1)
    cos, sin = cos_TxH2[:, None, :], sin_TxH2[:, None, :]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def qkv(lp: dict, x_BxTxD: Array, positions_T: Array, cfg: TransformerConfig):
    """Rotated queries, keys and values (B, T, N, Dh) in the compute dtype."""
    B, T, _ = x_BxTxD.shape
    dt = lp["wq"].dtype
    h = rms_norm(x_BxTxD, lp["attn_norm"])
    split = lambda y: y.reshape(B, T, cfg.n_heads, cfg.head_dim)
    cos, sin = rope_angles(positions_T, cfg.head_dim, cfg.rope_theta)
    q = apply_rope(split(mm(h, lp["wq"])), cos, sin).astype(dt)
    k = apply_rope(split(mm(h, lp["wk"])), cos, sin).astype(dt)
    v = split(mm(h, lp["wv"])).astype(dt)
    return q, k, v


def attention_impl(choice: str, q_BxTxNxH: Array, platform: str | None = None) -> str:
    """The implementation `jax.nn.dot_product_attention` gets for `choice` ("auto" | "xla" |
    "cudnn") on `platform` (None: the default backend): "auto" is cuDNN where its fused kernel
    applies (a GPU, 16-bit queries, a head dimension a multiple of 8 up to 128), else XLA. An
    explicit "cudnn" off a GPU is refused in one line."""
    backend = platform or _backend()
    on_gpu = backend == "gpu"
    if choice == "cudnn" and not on_gpu:
        raise ValueError(
            f"model.attention='cudnn' needs a GPU (cuDNN); this backend is {backend}: use "
            "'auto' or 'xla'"
        )
    if choice != "auto":
        return choice
    H = q_BxTxNxH.shape[-1]
    fits = q_BxTxNxH.dtype in (jnp.bfloat16, jnp.float16) and H % 8 == 0 and H <= 128
    return "cudnn" if on_gpu and fits else "xla"


def _backend() -> str:
    return jax.default_backend()


@functools.cache
def _warn_cudnn_fallback(reason: str) -> None:
    logging.warning(
        "gpn_jax: cuDNN's fused attention is unavailable here (%s); Transformer++ uses XLA's "
        "(model.attention=xla says so without this warning)",
        reason,
    )


def causal_attention(q: Array, k: Array, v: Array, choice: str, platform=None) -> Array:
    """Causal attention over the window (B, T, N, H) with `attention_impl(choice, q, platform)`;
    where "auto" takes cuDNN and cuDNN refuses when traced (no cuDNN found, an unsupported GPU),
    XLA's with one warning. An explicit "cudnn" raises what cuDNN raised."""
    impl = attention_impl(choice, q, platform)
    if impl == "cudnn" and choice == "auto":
        try:
            return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)
        except (RuntimeError, NotImplementedError, ValueError) as e:
            _warn_cudnn_fallback(" ".join(str(e).split())[:200])
            impl = "xla"
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)


def block(lp: dict, x_BxTxD: Array, cfg: TransformerConfig, platform=None) -> Array:
    """One pre-norm block over a full causal window (positions 0..T-1)."""
    B, T, D = x_BxTxD.shape
    q, k, v = qkv(lp, x_BxTxD, jnp.arange(T), cfg)
    att = causal_attention(q, k, v, cfg.attention, platform)
    x = x_BxTxD + mm(att.reshape(B, T, D), lp["wo"])
    return x + swiglu(lp, rms_norm(x, lp["mlp_norm"]))


def head_logits(cp: dict, h: Array, tie: bool) -> Array:
    """Logits (float32) from final-normed hidden states."""
    return mm(h, cp["embed"].T if tie else cp["head"])


# ----------------------------------------------------------------------------- the model
class Transformer(SpecModel):
    """Transformer++ language model: pure functions over `params` (see `gpn_jax.models.base`)."""

    def __init__(self, config: TransformerConfig, platform: str | None = None):
        self.config = config
        self.platform = platform  # the attention's target (None: the default backend)

    def on_platform(self, platform: str) -> "Transformer":
        """The same model with its attention chosen for `platform` ("cpu", "gpu", "tpu"), e.g.
        to compile for a GPU from a CPU host."""
        return Transformer(self.config, platform)

    # ------------------------------------------------------------------ parameters and state
    # init / param_axes / axis_sizes come from `param_specs` (models.base.SpecModel)
    param_specs = staticmethod(param_specs)

    def init_state(self, batch_size: int = 0):
        """No state crosses windows: always None."""
        return None

    def weight_decay_mask(self, params) -> dict:
        return weight_decay_mask(params)

    def _compute_params(self, params):
        return cast_matrices(params, self.config.compute_dtype)

    def inputs(self, tokens_BxT: Array) -> Array:
        """[bos, tokens[:, :-1]]: what the model reads to predict each position of the window."""
        bos = jnp.full((tokens_BxT.shape[0], 1), self.config.bos_id, tokens_BxT.dtype)
        return jnp.concatenate([bos, tokens_BxT[:, :-1]], axis=1)

    # ------------------------------------------------------------------ windows
    def hidden(self, params, tokens_BxT: Array):
        """Final-normed hidden states (B, T, d) float32 and the compute-dtype params."""
        c = self.config
        cp = self._compute_params(params)
        x = jnp.take(cp["embed"], self.inputs(tokens_BxT), axis=0).astype(jnp.float32)
        fn = lambda lp, x: block(lp, x, c, self.platform)
        if c.remat:
            fn = jax.checkpoint(fn)
        for i in range(c.n_layers):
            x = fn(cp[f"layer_{i}"], x)
        return rms_norm(x, cp["final_norm"]), cp

    def _logits_fn(self, cp):
        return lambda h: head_logits(cp, h, self.config.tie_embeddings)

    def loss(self, params, tokens_BxT, carry=None, mask=None):
        """Mean CE over all B*T positions, or over those where `mask` (broadcast to (B, T)) is
        True. Returns (loss, (carry, metrics)); carry passes as is."""
        h, cp = self.hidden(params, tokens_BxT)
        h_TxBxD, c = jnp.swapaxes(h, 0, 1), self.config.loss_chunk
        if mask is not None:
            ce = loss_lib.per_token_cross_entropy(self._logits_fn(cp), h_TxBxD, tokens_BxT.T, c)
            loss = masked_mean(ce.T, mask)
        else:
            total = loss_lib.cross_entropy_sum(self._logits_fn(cp), h_TxBxD, tokens_BxT.T, c)
            loss = total / tokens_BxT.size
        return loss, (carry, {"loss": loss})

    def token_losses(self, params, tokens_BxT, carry=None):
        h, cp = self.hidden(params, tokens_BxT)
        h_TxBxD, c = jnp.swapaxes(h, 0, 1), self.config.loss_chunk
        ce = loss_lib.per_token_cross_entropy(self._logits_fn(cp), h_TxBxD, tokens_BxT.T, c)
        return ce.T, carry

    def logits(self, params, tokens_BxT, carry=None):
        """Full (B, T, V) float32 logits (short windows only); logits[:, t] predicts token t."""
        h, cp = self.hidden(params, tokens_BxT)
        return head_logits(cp, h, self.config.tie_embeddings), carry

    # ------------------------------------------------------------------ decoding
    # State: {'k', 'v': (n_layers, B, max_seq_len, N, Dh) in the compute dtype, 'pos': int32 ()}.
    # `pos` is the position the next observed token is written to. The cache never changes
    # shape, so `decode_step` traces once per batch size; reading stays masked to `<= pos`.
    # Writing past max_seq_len is out of range (dynamic_update_slice would clamp): callers stop.
    def _decode_token(self, cp, state, token_B):
        c = self.config
        B = token_B.shape[0]
        pos = state["pos"]
        x = jnp.take(cp["embed"], token_B[:, None], axis=0).astype(jnp.float32)  # (B, 1, d)
        valid = (jnp.arange(c.max_seq_len) <= pos)[None, None, None, :]  # (1, 1, 1, S)
        ks, vs = [], []
        for i in range(c.n_layers):
            lp = cp[f"layer_{i}"]
            q, k, v = qkv(lp, x, pos[None], c)
            K = jax.lax.dynamic_update_slice(
                state["k"][i], k.astype(state["k"].dtype), (0, pos, 0, 0)
            )
            V = jax.lax.dynamic_update_slice(
                state["v"][i], v.astype(state["v"].dtype), (0, pos, 0, 0)
            )
            att = jax.nn.dot_product_attention(q, K, V, mask=valid)
            x = x + mm(att.reshape(B, 1, c.d_model), lp["wo"])
            x = x + swiglu(lp, rms_norm(x, lp["mlp_norm"]))
            ks.append(K)
            vs.append(V)
        logits = head_logits(cp, rms_norm(x[:, 0], cp["final_norm"]), c.tie_embeddings)
        return logits, {"k": jnp.stack(ks), "v": jnp.stack(vs), "pos": pos + 1}

    def start_decode(self, params, carry=None, batch_size: int = 1):
        """Fresh sequences: reads BOS at position 0. Returns logits (B, V) of the first token and
        the KV-cache state. A Transformer carry holds no batch size (it is None), so pass
        `batch_size`; a batch-1 state is also broadcast to the token batch by `decode_step`
        (every fresh sequence has the same BOS cache entry)."""
        c = self.config
        cp = self._compute_params(params)
        shape = (c.n_layers, batch_size, c.max_seq_len, c.n_heads, c.head_dim)
        dt = jnp.dtype(c.compute_dtype)
        state = {
            "k": jnp.zeros(shape, dt),
            "v": jnp.zeros(shape, dt),
            "pos": jnp.zeros((), jnp.int32),
        }
        return self._decode_token(cp, state, jnp.full((batch_size,), c.bos_id, jnp.int32))

    def decode_step(self, params, state, token_B):
        """Observe `token_B` (B,) at position `state['pos']`; return logits (B, V) of the next."""
        B = token_B.shape[0]
        if state["k"].shape[1] != B:
            if state["k"].shape[1] != 1:
                raise ValueError(f"decode state has batch {state['k'].shape[1]}, token batch {B}")
            bcast = lambda a: jnp.broadcast_to(a, (a.shape[0], B, *a.shape[2:]))
            state = {"k": bcast(state["k"]), "v": bcast(state["v"]), "pos": state["pos"]}
        return self._decode_token(self._compute_params(params), state, token_B)

    # ------------------------------------------------------------------ accounting
    def flops_per_token(self, seq_len: int | None = None) -> dict:
        """Analytic matmul FLOPs per token (2 per multiply-add); training = 3 x forward.

        Counts the Q/K/V/O projections (4 d^2), the SwiGLU MLP (3 d f) and the LM head (d V)
        per token; the embedding lookup is free. Attention, causal average: a token at
        context c costs c*d multiply-adds for QK^T and c*d for AV; averaged over a window of
        T = seq_len (default max_seq_len) we take c = T/2, i.e. T*d multiply-adds = 2*T*d
        FLOPs per layer per token.
        """
        c = self.config
        T = c.max_seq_len if seq_len is None else seq_len
        d, f, v = c.d_model, c.d_ffn, c.vocab_size
        per_layer = 4 * d * d + 3 * d * f + 2 * (T / 2) * d
        macs = c.n_layers * per_layer + d * v
        return {"forward": 2 * macs, "train": 6 * macs}

    def bytes_per_token(self, batch_size: int, seq_len: int) -> dict:
        """Analytic training-step memory traffic per token (`accounting.layer_parallel_bytes`).

        Per layer: matrices 4 d^2 + 3 d f; saved residuals 10 d + 3 f (block input and its
        norm, q, k, v, the rotated q and k, the attention output, the mid-block stream and its
        norm; SwiGLU gate, up and their product). Head: the V x d embedding (or head). Mixer:
        XLA's attention materialises each head's row of T scores (no fused kernel assumed):
        scores written, read by the softmax, probabilities written, read by the value product;
        the backward reads the probabilities, writes and reads their cotangent and the scores'
        (read twice: dQ and dK): 10 x 4 B x N T per layer.
        """
        c = self.config
        d, f, L = c.d_model, c.d_ffn, c.n_layers
        return accounting.layer_parallel_bytes(
            c,
            batch_size,
            seq_len,
            matrices=L * (4 * d * d + 3 * d * f),
            residual_width=L * (10 * d + 3 * f),
            mixer=L * 10 * 4 * c.n_heads * seq_len,
        )
