"""Gated DeltaNet baseline: parameter specs (initialiser, shape, logical axes) plus the model's pure entry points.

Architecture (the layer of flash-linear-attention's `GatedDeltaNet`): token embedding, then
`n_layers` pre-norm blocks

    x = x + Wo · (rms_head(o) * w_o * silu(Wg · n)),   n = rms(x)               token mixer
        q, k, v = silu(conv4(Wq · n)), silu(conv4(Wk · n)), silu(conv4(Wv · n))  depthwise causal
        q, k    = l2n(q) per head, l2n(k) per head;  beta = sigmoid(Wb · n)
                  (2 sigmoid(Wb · n) with `negative_eigenvalues`: Grazzi et al. 2024)
        g       = -exp(A_log) * softplus(Wa · n + dt_bias)                     log-decay <= 0
        o       = gated delta rule(q, k, v, beta, g), query scale d_key^-1/2   (core.gated_delta)
    x = x + W2 · (silu(W1 · rms(x)) * W3 · rms(x))                                 SwiGLU MLP

then a final RMSNorm and the LM head (the transposed embedding when `tie_embeddings`, else a
separate (d, V) matrix). No biases. Heads: H = n_heads, K = d_key (q/k), U = d_value (v); the
output RMSNorm is per head with one (U,) weight shared by the heads.

Initialisation (our choice, documented here, as for Transformer++):
  * embedding N(0, 0.02); input projections (Wq, Wk, Wv, Wa, Wb, Wg, W1, W3, untied head)
    LeCun-normal; output projections (Wo, W2) N(0, 0.02 / sqrt(2 * n_layers));
  * short-convolution filters U(-1/sqrt(w), 1/sqrt(w)), w = conv_size (PyTorch's Conv1d
    default for a depthwise filter);
  * A_log and dt_bias as GPN+M's memory write (`gpn_jax.models.params.a_log_init`, `dt_bias_init`);
  * norm weights ones.

Window convention (see `gpn_jax.models.base`): position t of `tokens` is predicted from the
carry plus `tokens[:, :t]`; the model reads `[carry.last_token, tokens[:, :-1]]`, and a fresh
carry's `last_token` is `bos_id`. The carry also holds, per layer, the last `conv_size - 1`
pre-convolution q/k/v projections and the delta-rule state S (B, H, K, U), so a window of 2T
equals two windows of T with the carry passed on.

Numerics follow `gpn_jax.core.norms`: matrices are cast once to `compute_dtype`, matmuls
accumulate in float32; the residual stream, norms, convolution and the delta rule (state
included) are float32. Training uses the chunkwise-parallel delta rule (`chunk_size`);
`chunk_size=0` selects the token-by-token recurrent form (same math; a reference), which
decoding always uses.
"""

import math
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from gpn_jax.core import gated_delta
from gpn_jax.core import loss as loss_lib
from gpn_jax.core.mlp import swiglu
from gpn_jax.core.norms import cast_matrices, l2n, mm, rms, rms_norm
from gpn_jax.models import accounting
from gpn_jax.models.base import SpecModel, masked_mean
from gpn_jax.models.configs import GDNConfig  # defined there, JAX-free
from gpn_jax.models.params import (
    EMBED,
    HEADS,
    VOCAB,
    a_log_init,
    dt_bias_init,
    lecun,
    ones,
    param,
    small,
    swiglu_specs,
)

Array = jax.Array


class GDNCarry(NamedTuple):
    """What crosses windows. `conv[i]` (B, conv_size - 1, d_conv): layer i's last pre-conv
    [q | k | v] projections; `S[i]` (B, H, K, U): layer i's delta-rule state; `last_token` (B,)
    int32: the token the next window reads first (`bos_id` for a fresh sequence)."""

    conv: tuple
    S: tuple
    last_token: Array


class GDNDecodeState(NamedTuple):
    """Decoding state: the carry's per-layer conv and delta states after reading every observed
    token (unlike `GDNCarry`, nothing is left to read)."""

    conv: tuple
    S: tuple


# ----------------------------------------------------------------------------- parameters


def param_specs(c: GDNConfig) -> dict:
    """Every Gated DeltaNet parameter: initialiser (module doc), shape, logical axes (q / k / v,
    gate, beta and decay projections and the depthwise filters split by whole heads, the MLP
    by d_ffn, the vocabulary; see `gpn_jax.models.params`)."""
    d, f, v, h = c.d_model, c.d_ffn, c.vocab_size, c.n_heads
    out_init = nn.initializers.normal(stddev=0.02 / math.sqrt(2 * c.n_layers))
    bound = 1.0 / math.sqrt(c.conv_size)
    conv_init = lambda key, shape, dtype=jnp.float32: jax.random.uniform(
        key, shape, dtype, -bound, bound
    )
    col = lambda init, n: param(init, (d, n), (EMBED, HEADS))  # (d, H*) column-parallel
    conv = lambda n: param(conv_init, (c.conv_size, n), (None, HEADS))
    tree = {"embed": param(small, (v, d), (VOCAB, EMBED))}
    for i in range(c.n_layers):
        tree[f"layer_{i}"] = {
            "attn_norm": param(ones, (d,)),
            "wq": col(lecun, c.d_qk),
            "wk": col(lecun, c.d_qk),
            "wv": col(lecun, c.d_v),
            "conv_q": conv(c.d_qk),
            "conv_k": conv(c.d_qk),
            "conv_v": conv(c.d_v),
            "wb": col(lecun, h),
            "wa": col(lecun, h),
            "A_log": param(a_log_init, (h,), (HEADS,)),
            "dt_bias": param(dt_bias_init, (h,), (HEADS,)),
            "wg": col(lecun, c.d_v),
            "o_norm": param(ones, (c.d_value,)),
            "wo": param(out_init, (c.d_v, d), (HEADS, EMBED)),
            "mlp_norm": param(ones, (d,)),
            **swiglu_specs(d, f, out_init),
        }
    tree["final_norm"] = param(ones, (d,))
    if not c.tie_embeddings:
        tree["head"] = param(lecun, (d, v), (EMBED, VOCAB))
    return tree


def weight_decay_mask(params) -> dict:
    """Decay the matrices (embedding, projections, head) only. Never the norm weights, A_log,
    dt_bias, nor the depthwise convolution filters (per-channel filters, not matrices)."""

    def decays(path, p):
        name = getattr(path[-1], "key", str(path[-1]))
        return p.ndim >= 2 and not name.startswith("conv_")

    return jax.tree_util.tree_map_with_path(decays, params)


# ----------------------------------------------------------------------------- pure blocks
def short_conv(
    x_BxTxC: Array, state_BxWxC: Array, w_WxC: Array, resets_BxT: Array | None = None
) -> tuple[Array, Array]:
    """Depthwise causal convolution over [state, x], float32. Returns (y (B, T, C), new state).

    With `resets_BxT` (document starts) a tap never reads across a reset: inputs of an
    earlier document count as the zeros of a fresh state (segment ids by cumulative resets)."""
    T, W = x_BxTxC.shape[1], w_WxC.shape[0]
    xx = jnp.concatenate([state_BxWxC.astype(jnp.float32), x_BxTxC.astype(jnp.float32)], axis=1)
    w = w_WxC.astype(jnp.float32)
    if resets_BxT is None:
        y = sum(w[i] * xx[:, i : i + T] for i in range(W))
        return y, xx[:, T:]
    seg = jnp.cumsum(resets_BxT.astype(jnp.int32), axis=1)  # (B, T); the state is segment 0
    seg_xx = jnp.pad(seg, ((0, 0), (W - 1, 0)))[..., None]  # (B, W - 1 + T, 1)
    same = lambda lo, n, ref: (seg_xx[:, lo : lo + n] == ref).astype(jnp.float32)
    y = sum(w[i] * xx[:, i : i + T] * same(i, T, seg[..., None]) for i in range(W))
    return y, xx[:, T:] * same(T, W - 1, seg[:, -1:, None])


# log-decay at a document start: exp(RESET_LOG_DECAY) underflows to exactly 0, so the state
# entering that step is dropped, in the chunked form as in the recurrent one (the chunked
# form forms segment sums directly and masks before exp, so no inf or nan arises).
RESET_LOG_DECAY = -1e30


def token_mixer(lp, x_BxTxD, conv_state, S, cfg: GDNConfig, chunk: int, resets=None):
    """The Gated DeltaNet mixer over a window. Returns (update (B, T, d), conv state, S).
    `resets` (B, T) bool: the conv and delta states entering those positions are dropped."""
    B, T, _ = x_BxTxD.shape
    H, K, U = cfg.n_heads, cfg.d_key, cfg.d_value
    n = rms_norm(x_BxTxD, lp["attn_norm"])
    pre = jnp.concatenate([mm(n, lp["wq"]), mm(n, lp["wk"]), mm(n, lp["wv"])], axis=-1)
    w = jnp.concatenate([lp["conv_q"], lp["conv_k"], lp["conv_v"]], axis=-1)
    y, conv_state = short_conv(pre, conv_state, w, resets)
    y = jax.nn.silu(y)
    q = l2n(y[..., : cfg.d_qk].reshape(B, T, H, K))
    k = l2n(y[..., cfg.d_qk : 2 * cfg.d_qk].reshape(B, T, H, K))
    v = y[..., 2 * cfg.d_qk :].reshape(B, T, H, U)
    beta = jax.nn.sigmoid(mm(n, lp["wb"]))  # (B, T, H)
    if cfg.negative_eigenvalues:  # beta in [0, 2]: I - beta k k^T reaches eigenvalue -1
        beta = 2.0 * beta
    g = -jnp.exp(lp["A_log"]) * jax.nn.softplus(mm(n, lp["wa"]) + lp["dt_bias"])
    if resets is not None:
        g = jnp.where(resets[..., None], RESET_LOG_DECAY, g)
    if chunk:
        o, S = gated_delta.chunked(q, k, v, beta, g, initial_state=S, chunk_size=chunk)
    else:
        o, S = gated_delta.recurrent(q, k, v, beta, g, initial_state=S)
    gate = jax.nn.silu(mm(n, lp["wg"])).reshape(B, T, H, U)
    o = (rms(o) * lp["o_norm"] * gate).reshape(B, T, H * U)
    return mm(o, lp["wo"]), conv_state, S


def block(lp, x, conv_state, S, cfg: GDNConfig, chunk: int, resets=None):
    """One pre-norm block: mixer and MLP with residuals. Returns (x, conv state, S)."""
    upd, conv_state, S = token_mixer(lp, x, conv_state, S, cfg, chunk, resets)
    x = x + upd
    return x + swiglu(lp, rms_norm(x, lp["mlp_norm"])), conv_state, S


def head_logits(cp: dict, h: Array, tie: bool) -> Array:
    """Logits (float32) from final-normed hidden states."""
    return mm(h, cp["embed"].T if tie else cp["head"])


def cross_entropy(cp, h_BxTxD, tokens_BxT, chunk: int, tie: bool, per_token: bool):
    """CE of each position (T, B) or its sum, decoding `chunk` positions at a time
    (`gpn_jax.core.loss`)."""
    ce = loss_lib.per_token_cross_entropy if per_token else loss_lib.cross_entropy_sum
    logits_fn = lambda h: head_logits(cp, h, tie)
    return ce(logits_fn, jnp.swapaxes(h_BxTxD, 0, 1), tokens_BxT.T, chunk)


# ----------------------------------------------------------------------------- the model
class GatedDeltaNet(SpecModel):
    """Gated DeltaNet language model: pure functions over `params` (see `gpn_jax.models.base`)."""

    def __init__(self, config: GDNConfig):
        self.config = config

    # ------------------------------------------------------------------ parameters and state
    # init / param_axes / axis_sizes come from `param_specs` (models.base.SpecModel)
    param_specs = staticmethod(param_specs)

    def init_state(self, batch_size: int) -> GDNCarry:
        c = self.config
        conv = jnp.zeros((batch_size, c.conv_size - 1, c.d_conv), jnp.float32)
        S = jnp.zeros((batch_size, c.n_heads, c.d_key, c.d_value), jnp.float32)
        return GDNCarry(
            conv=(conv,) * c.n_layers,
            S=(S,) * c.n_layers,
            last_token=jnp.full((batch_size,), c.bos_id, jnp.int32),
        )

    def weight_decay_mask(self, params) -> dict:
        return weight_decay_mask(params)

    def _compute_params(self, params):
        return cast_matrices(params, self.config.compute_dtype)

    # ------------------------------------------------------------------ windows
    def _run(self, cp, inputs_BxT, conv, S, chunk: int, resets=None):
        """Reads `inputs`; returns final-normed hidden states (B, T, d) and the new layer states."""
        c = self.config
        x = jnp.take(cp["embed"], inputs_BxT, axis=0).astype(jnp.float32)
        fn = lambda lp, x, cs, s, r: block(lp, x, cs, s, c, chunk, r)
        if c.remat:
            fn = jax.checkpoint(fn)
        new_conv, new_S = [], []
        for i in range(c.n_layers):
            x, cs, s = fn(cp[f"layer_{i}"], x, conv[i], S[i], resets)
            new_conv.append(cs)
            new_S.append(s)
        return rms_norm(x, cp["final_norm"]), tuple(new_conv), tuple(new_S)

    def hidden(self, params, tokens_BxT: Array, carry: GDNCarry | None = None, resets=None):
        """Final-normed hidden states (B, T, d) float32, the new carry and the compute params.

        `resets` (B, T) bool (document starts): those positions read BOS from the initial
        state, as a fresh sequence does; None: no resets."""
        carry = self.init_state(tokens_BxT.shape[0]) if carry is None else carry
        cp = self._compute_params(params)
        first = carry.last_token.astype(tokens_BxT.dtype)[:, None]
        inputs = jnp.concatenate([first, tokens_BxT[:, :-1]], axis=1)
        if resets is not None:
            inputs = jnp.where(resets, jnp.asarray(self.config.bos_id, inputs.dtype), inputs)
        c = self.config
        h, conv, S = self._run(cp, inputs, carry.conv, carry.S, c.chunk_size, resets)
        new = GDNCarry(conv, S, tokens_BxT[:, -1].astype(jnp.int32))
        return h, new, cp

    def loss(self, params, tokens_BxT, carry=None, mask=None, resets=None):
        """Mean CE over all B*T positions, or over those where `mask` (broadcast to (B, T)) is
        True. Returns (loss, (carry, metrics)). `resets`: as for `hidden`."""
        h, carry, cp = self.hidden(params, tokens_BxT, carry, resets)
        c = self.config
        if mask is not None:
            ce = cross_entropy(cp, h, tokens_BxT, c.loss_chunk, c.tie_embeddings, per_token=True)
            loss = masked_mean(ce.T, mask)
        else:
            total = cross_entropy(cp, h, tokens_BxT, c.loss_chunk, c.tie_embeddings, False)
            loss = total / tokens_BxT.size
        state_rms = jnp.sqrt(jnp.mean(jnp.stack([jnp.mean(jnp.square(s)) for s in carry.S])))
        return loss, (carry, {"loss": loss, "state_rms": state_rms})

    def token_losses(self, params, tokens_BxT, carry=None, resets=None):
        """Per-position CE (B, T) and the new carry."""
        h, carry, cp = self.hidden(params, tokens_BxT, carry, resets)
        c = self.config
        ce = cross_entropy(cp, h, tokens_BxT, c.loss_chunk, c.tie_embeddings, per_token=True)
        return ce.T, carry

    def logits(self, params, tokens_BxT, carry=None):
        """Full (B, T, V) float32 logits (short windows only); logits[:, t] predicts token t."""
        h, carry, cp = self.hidden(params, tokens_BxT, carry)
        return head_logits(cp, h, self.config.tie_embeddings), carry

    # ------------------------------------------------------------------ decoding
    # One token at a time with the recurrent delta rule: O(1) in context length.
    def _read(self, cp, state: GDNDecodeState, token_B: Array):
        h, conv, S = self._run(cp, token_B[:, None], state.conv, state.S, chunk=0)
        logits = head_logits(cp, h[:, 0], self.config.tie_embeddings)
        return logits, GDNDecodeState(conv, S)

    def start_decode(self, params, carry: GDNCarry | None = None, batch_size: int = 1):
        """Reads the carry's pending `last_token`. Returns logits (B, V) of the next token and
        the decoding state. `carry=None` starts `batch_size` fresh sequences (from BOS)."""
        carry = self.init_state(batch_size) if carry is None else carry
        state = GDNDecodeState(carry.conv, carry.S)
        return self._read(self._compute_params(params), state, carry.last_token)

    def decode_step(self, params, state: GDNDecodeState, token_B: Array):
        """Observe `token_B` (B,); return logits (B, V) of the following token and the new state."""
        return self._read(self._compute_params(params), state, token_B.astype(jnp.int32))

    # ------------------------------------------------------------------ accounting
    def flops_per_token(self, seq_len: int | None = None) -> dict:
        """Analytic matmul FLOPs per token (2 per multiply-add); training = 3 x forward.

        Per layer: projections d (2 H K + 2 H U + 2 H) (q, k, v, g, a, b), output H U d, SwiGLU
        3 d f; the chunked delta rule at chunk length C = min(chunk_size, seq_len) (see
        `gated_delta.flops_per_token`; recurrent form: 3 K U per head). Plus the LM head d V.
        Elementwise work (short convolution, norms, gates) and the embedding lookup are free.
        """
        c = self.config
        v, h = c.vocab_size, c.n_heads
        proj = self._layer_matrices()
        if c.chunk_size:
            T = seq_len or c.chunk_size
            C = gated_delta.chunk_len(T, c.chunk_size)
            delta = gated_delta.flops_per_token(h, c.d_key, c.d_value, C) // 2
        else:
            delta = 3 * h * c.d_key * c.d_value
        macs = c.n_layers * (proj + delta) + c.d_model * v
        return {"forward": 2 * macs, "train": 6 * macs}

    def _layer_matrices(self) -> int:
        """Weights of one layer's matrices: projections d (2HK + 2HU + 2H), output HU d, SwiGLU
        3 d f (also each token's multiply-adds through them)."""
        c = self.config
        d = c.d_model
        return d * (2 * c.d_qk + 2 * c.d_v + 2 * c.n_heads) + c.d_v * d + 3 * d * c.d_ffn

    def bytes_per_token(self, batch_size: int, seq_len: int) -> dict:
        """Analytic training-step memory traffic per token (`accounting.layer_parallel_bytes`).

        Per layer: matrices `_layer_matrices` (d (2HK + 2HU + 2H) + HU d + 3 d f); saved
        residuals 4 d + 6 HK + 5 HU + 2 H + 3 f (block input and its norm, q / k / v before and
        after the convolution, the normalised q and k, beta and the decay, the output gate, the
        delta-rule output and its gated norm, the mid-block stream and its norm; SwiGLU gate,
        up and product). Head: the V x d embedding (or head). Mixer, per layer: the chunked
        rule at C = min(chunk_size, T) writes the (H, K, U) float32 state at each chunk
        boundary, reads it in the next chunk and in the backward, and writes and reads its
        cotangent (5 x 4 B x HKU / C), and forms three (C, C) matrices per head (decay-weighted
        K K^T, its triangular inverse, Q K^T), each written and read in the forward and twice
        in the backward (3 x 6 x 4 B x H C). The recurrent form (chunk_size 0) reads and writes
        the state every token, stores it for the backward and writes and reads its cotangent
        (6 x 4 B x HKU).
        """
        c = self.config
        d, f, h, L = c.d_model, c.d_ffn, c.n_heads, c.n_layers
        hku = h * c.d_key * c.d_value
        if c.chunk_size:
            C = gated_delta.chunk_len(seq_len, c.chunk_size)
            mixer = 5 * 4 * hku / C + 3 * 6 * 4 * h * C
        else:
            mixer = 6 * 4 * hku
        return accounting.layer_parallel_bytes(
            c,
            batch_size,
            seq_len,
            matrices=L * self._layer_matrices(),
            residual_width=L * (4 * d + 6 * c.d_qk + 5 * c.d_v + 2 * h + 3 * f),
            mixer=L * mixer,
        )
