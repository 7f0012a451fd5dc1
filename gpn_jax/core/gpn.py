"""The GPN / GPN+M recurrence as pure functions (the paper's one step).

Shape key: B batch, T time, D state width `d`, E embedding width `d_emb`, H memory heads,
K key width `dk`, U value width `dv`, F `d_ffn`, V vocabulary.

Parameters are plain nested dicts (declared by `gpn_jax.models.gpn`):

    embed (V, E)
    decode {norm (D), proj (D, E), [bias (E)]}
    ground {emb_norm (E), fuse (E, D), gate_norm (D), gate_w (D, D), gate_b (D)}
    write  {norm (D), wk (D, HK), bk (HK), wv (D, HU), wbeta (D, H), wa (D, H), A_log (H), dt_bias (H)}
    layer_i {ffn_norm (D), w1 (D, F), w3 (D, F), w2 (F, D), pg_norm (D), wpg (D, D), bpg (D),
             [read_norm (D), wq (D, HK), bq (HK), wrg (D, HU), out_norm (HU), wo (HU, D)]}

One token x_t, from carry (s, s_prev, M):

    M'  = write(s_prev, s, M)                 # once per token, predicts with the undecayed M
    c   = s;  for each layer: c = pg(c) * c + ffn(c) + read(c, M')
    p   = c                                   # the predicted state; decoded after the scan
    s'  = gate(p) * p + xg_t                  # xg_t = norm_e(Emb[x_t]) @ Wfuse, before the scan
    carry' = (s', s, M')
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from gpn_jax.core.mlp import swiglu
from gpn_jax.core.norms import RMS_EPS, l2n, mm, rms_norm

Array = jax.Array
Params = dict


class GPNCarry(NamedTuple):
    """Recurrent state of a batch of sequences; GPN without memory leaves `s_prev` and `M` None."""

    s: Array  # (B, D) grounded state after the last observed token
    s_prev: Array | None  # (B, D) grounded state one step earlier
    M: Array | None  # (B, H, K, U) matrix memory


class Intervention(NamedTuple):
    """Causal edits for ablations; the default (all None) is the model itself.

    direction: (D,) unit vector projected out of the predicted state (before decode and ground).
    head_mask: (H,) multiplies each head's memory read `o` (0 zeroes that head).
    read_scale: scalar multiplying the whole read term (0 removes the memory read).
    """

    direction: Array | None = None
    head_mask: Array | None = None
    read_scale: Array | None = None


class StepOutput(NamedTuple):
    p: Array  # (B, D) predicted state s^p
    log_decay: Array | None  # (B, H) memory log-decay g of this step


def init_carry(
    batch: int, d: int, memory_shape: tuple[int, int, int] | None, memory_dtype="float32"
) -> GPNCarry:
    """All-zero carry. `memory_shape` is (H, K, U), or None for GPN without memory; the memory
    is stored in `memory_dtype` (its updates are computed in float32, see `memory_write`)."""
    s = jnp.zeros((batch, d), jnp.float32)
    if memory_shape is None:
        return GPNCarry(s, None, None)
    return GPNCarry(s, s, jnp.zeros((batch, *memory_shape), memory_dtype))


def reset_carry(carry: GPNCarry, keep_B: Array) -> GPNCarry:
    """The carry where `keep_B` (B,) is 1, the initial (all-zero) carry where it is 0.

    Stateful training resets the state at every document start inside a window: a
    multiplication, so it costs one elementwise product per step and stays differentiable."""

    def scale(x):  # keep is 0 / 1: exact in any dtype (the memory may be stored in bf16)
        return None if x is None else x * keep_B.astype(x.dtype).reshape(-1, *([1] * (x.ndim - 1)))

    return GPNCarry(*(scale(x) for x in carry))


def has_memory(params: Params) -> bool:
    return "write" in params


def layer_names(params: Params) -> list[str]:
    n = sum(1 for k in params if k.startswith("layer_"))
    return [f"layer_{i}" for i in range(n)]


def memory_shape(params: Params) -> tuple[int, int, int] | None:
    """(H, K, U) read off the parameter shapes, or None without memory."""
    if not has_memory(params):
        return None
    w = params["write"]
    h = w["A_log"].shape[0]
    return h, w["wk"].shape[1] // h, w["wv"].shape[1] // h


def grounding_inputs(params: Params, tokens: Array) -> Array:
    """xg = norm_e(Emb[x]) @ Wfuse for every position at once (no recurrence in it)."""
    g = params["ground"]
    return mm(rms_norm(params["embed"][tokens], g["emb_norm"]), g["fuse"])


def _heads(x: Array, h: int) -> Array:
    return x.reshape(*x.shape[:-1], h, x.shape[-1] // h)


def memory_write(wp: Params, s_prev: Array, s: Array, M: Array) -> tuple[Array, Array]:
    """Gated delta write: key from the previous grounded state, value/beta/decay from the current.

    Returns the new memory (B, H, K, U) and the per-head log-decay g (B, H). The update is
    computed in float32 and stored back in M's dtype (`GPNConfig.memory_dtype`).
    """
    h = wp["A_log"].shape[0]
    a, b = rms_norm(s_prev, wp["norm"]), rms_norm(s, wp["norm"])
    k = l2n(jax.nn.relu(_heads(mm(a, wp["wk"]) + wp["bk"], h)))  # (B, H, K)
    v = _heads(mm(b, wp["wv"]), h)  # (B, H, U)
    beta = jax.nn.sigmoid(mm(b, wp["wbeta"]))  # (B, H)
    g = -jnp.exp(wp["A_log"]) * jax.nn.softplus(mm(b, wp["wa"]) + wp["dt_bias"])  # (B, H)
    return delta_write(M, k, v, beta, jnp.exp(g)), g


def delta_write(M: Array, k: Array, v: Array, beta: Array, eg: Array) -> Array:
    """The memory's update rule per head: M' = eg M + k (beta (v - M^T k))^T, computed in
    float32 and stored in M's dtype. M (..., H, K, U), k (..., H, K), v (..., H, U), beta and
    the decay eg = exp(g) (..., H). The fused window and every kernel backend compute this
    rule (`gpn_jax.kernels.xla` is their reference)."""
    Mf = M.astype(jnp.float32)
    k_M = jnp.einsum("...hk,...hku->...hu", k, Mf)  # prediction from the old, undecayed memory
    delta = jnp.einsum("...hk,...hu->...hku", k, beta[..., None] * (v - k_M))
    return (eg[..., None, None] * Mf + delta).astype(M.dtype)


def delta_factored(k, q, v, beta, eg, kM, qM):
    """`delta_write` and the read of the written memory through the memory's products
    kM = M^T k and qM = M^T q: (w, o) with w = beta (v - kM), so that M' = eg M + k w^T, and
    o = M'^T q = eg qM + (q . k) w (float32, before M' is stored). The fused window's backward
    differentiates this, leaving the memory-sized products to its kernels."""
    w = beta[..., None] * (v - kM)
    return w, eg[..., None] * qM + jnp.sum(q * k, axis=-1, keepdims=True) * w


def memory_read(lp: Params, c: Array, M: Array, iv: Intervention) -> Array:
    """Per-layer read of the shared memory with the current predicted state as query."""
    h = M.shape[1]
    r = rms_norm(c, lp["read_norm"])
    q = l2n(jax.nn.relu(_heads(mm(r, lp["wq"]) + lp["bq"], h)))  # (B, H, K)
    o = jnp.einsum("bhk,bhku->bhu", q, M.astype(jnp.float32))  # (B, H, U)
    if iv.head_mask is not None:
        o = o * iv.head_mask[:, None]
    o = o.reshape(*o.shape[:-2], -1)  # (B, HU)
    # norm_o(o) = o * scale * out_norm with one scale per row, so the scale is applied after
    # the Wo product (the same value). With heads split over `tensor`, this leaves each
    # layer's partial sums (ffn, read, sum of o^2) independent: XLA reduces them together.
    scale = jax.lax.rsqrt(jnp.mean(o * o, axis=-1, keepdims=True) + RMS_EPS)
    read = mm(jax.nn.silu(mm(r, lp["wrg"])) * o * lp["out_norm"], lp["wo"])
    read = read if iv.read_scale is None else read * iv.read_scale
    return read * scale


def predict_layer(lp: Params, c: Array, M: Array | None, iv: Intervention) -> Array:
    """c <- pg(c) * c + ffn(c) [+ read(c, M)]."""
    ffn = swiglu(lp, rms_norm(c, lp["ffn_norm"]))
    pg = jax.nn.sigmoid(mm(rms_norm(c, lp["pg_norm"]), lp["wpg"]) + lp["bpg"])
    out = pg * c + ffn
    if M is not None:
        out = out + memory_read(lp, c, M, iv)
    return out


def predict(params: Params, carry: GPNCarry, iv: Intervention = Intervention()):
    """Write once, then run the L predict layers. Returns (M', StepOutput(p, g))."""
    M, g = carry.M, None
    if M is not None:
        M, g = memory_write(params["write"], carry.s_prev, carry.s, M)
    c = carry.s
    for name in layer_names(params):
        c = predict_layer(params[name], c, M, iv)
    if iv.direction is not None:
        c = c - (c @ iv.direction)[..., None] * iv.direction
    return M, StepOutput(c, g)


def ground(gp: Params, p: Array, xg: Array) -> Array:
    """s' = sigma(norm_g(p) @ Wfg + bfg) * p + xg."""
    return jax.nn.sigmoid(mm(rms_norm(p, gp["gate_norm"]), gp["gate_w"]) + gp["gate_b"]) * p + xg


def step(
    params: Params, carry: GPNCarry, xg: Array, iv: Intervention = Intervention()
) -> tuple[GPNCarry, StepOutput]:
    """One token: write, predict, ground. The whole recurrence lives here."""
    M, out = predict(params, carry, iv)
    s_new = ground(params["ground"], out.p, xg)
    s_prev = None if M is None else carry.s
    return GPNCarry(s_new, s_prev, M), out


def decode(params: Params, p: Array) -> Array:
    """logits = (norm_d(p) @ Wdec [+ b]) @ Emb^T, float32."""
    dp = params["decode"]
    z = mm(rms_norm(p, dp["norm"]), dp["proj"])
    if "bias" in dp:
        z = z + dp["bias"]
    return mm(z, params["embed"].T)
