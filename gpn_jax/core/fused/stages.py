"""The fused window's elementwise stages: the memory's gated delta write and its reads, and a
predict layer's output from its fused projection (per block of heads where tp > 1).

The memory is stored in its carry's dtype (`GPNConfig.memory_dtype`), each write computed in
float32."""

import jax
import jax.numpy as jnp

from gpn_jax.core.fused.layout import Dims
from gpn_jax.core.fused.products import rows
from gpn_jax.core.gpn import delta_write
from gpn_jax.core.norms import RMS_EPS, l2n, rms

Array = jax.Array


def heads(x: Array, h: int) -> Array:
    return x.reshape(*x.shape[:-1], h, x.shape[-1] // h)


def split_cols(x: Array, widths: list[int]) -> list[Array]:
    return jnp.split(x, list(_cumsum(widths[:-1])), axis=-1)


def _cumsum(xs):
    t = 0
    for x in xs:
        t += x
        yield t


def rowwise(v_B: Array, x: Array) -> Array:
    """A per-row (B,) (or per-step-and-row (S, B)) factor shaped to broadcast against `x`
    (B, ...) (or (S, B, ...)), in x's dtype."""
    return v_B.reshape(*v_B.shape, *([1] * (x.ndim - v_B.ndim))).astype(x.dtype)


def write_inputs(dm: Dims, zk_prev, zw, a):
    """The write's key (l2-normalised), value, beta and log-decay g per head, from the previous
    key pre-activation and this step's [v | beta | a] columns."""
    return write_key(dm, zk_prev), *write_gates(dm, zw, a)


def write_key(dm: Dims, zk):
    return l2n(jax.nn.relu(heads(zk, dm.hb)))


def write_gates(dm: Dims, zw, a):
    """(v, beta, g) per head from the step's [v | beta | a] columns."""
    zv, zb, za = split_cols(zw, [dm.hu, dm.hb, dm.hb])
    return heads(zv, dm.hb), jax.nn.sigmoid(zb), -a * jax.nn.softplus(za)


def write(dm: Dims, zk_prev, zw, a, M):
    """Gated delta write from the previous key pre-activation and this step's [v | beta | a] columns
    (per block of heads: every head's write is local to it).

    Computed in float32, returned in M's dtype (`memory_dtype` storage)."""
    k, v, beta, g = write_inputs(dm, zk_prev, zw, a)
    return delta_write(M, k, v, beta, jnp.exp(g)), g


def write_read(dm: Dims, zk_prev, zw, a, zq, M):
    """`write` and layer 0's `read_out` by the kernels' `step`: (M', g, o)."""
    k, v, beta, g = write_inputs(dm, zk_prev, zw, a)
    Mn, o = dm.kernels.step(M, k, read_query(dm, zq), v, beta, jnp.exp(g))
    return Mn, g, o.reshape(*o.shape[:-2], dm.hu)


def read_query(dm: Dims, zq):
    """The read's query per head (l2-normalised), (B, [tp,] hb, k)."""
    return l2n(jax.nn.relu(heads(zq, dm.hb)))


def read_out(dm: Dims, zq, Mn):
    """Each head's memory read o, (B, [tp,] hu) per block."""
    q = read_query(dm, zq)
    o = jnp.einsum("...hk,...hku->...hu", q, Mn.astype(jnp.float32))
    return o.reshape(*q.shape[:-2], dm.hu)


def layer_pre(dm: Dims, Z, Mn):
    """tp == 1. From a layer's fused projection: X2 = [silu(gate) * up | silu(zrg) * rms(q . M')]
    and pg."""
    o = read_out(dm, split_cols(Z, dm.layer_cols())[3], Mn) if dm.memory else None
    return layer_out(dm, Z, o)


def layer_out(dm: Dims, Z, o):
    """tp == 1. `layer_pre` given the layer's memory read o (B, hu) (None without memory)."""
    gate, up, zpg, *read = split_cols(Z, dm.layer_cols())
    h = jax.nn.silu(gate) * up
    pg = jax.nn.sigmoid(zpg)
    if o is None:
        return h, pg
    return jnp.concatenate([h, jax.nn.silu(read[1]) * rms(o)], axis=-1), pg


def layer_local(dm: Dims, Z, Mn):
    """tp > 1. From a layer's column blocks: (h, r, o) with r = silu(zrg) * o not yet scaled
    by the read norm (whose sum of squares spans every block); all local to a block."""
    gate, up, *read = split_cols(Z, dm.layer_cols())
    h = jax.nn.silu(gate) * up
    if not dm.memory:
        return h, None, None
    zq, zrg = read
    o = read_out(dm, zq, Mn)
    return h, jax.nn.silu(zrg) * o, o


def layer_split(dm: Dims, fw: dict, i: int, Z, Mn):
    """tp > 1. A layer's ffn + read output (B, D) and, with memory, (r @ Wo, scale) for the
    backward. As `core.gpn.memory_read`, the read norm's per-row scale rsqrt(mean(o^2) + eps)
    multiplies the row-parallel product, so the three partial sums (h @ W2, r @ Wo, sum o^2)
    are independent: XLA reduces them in the layer's one all-reduce."""
    h, r, o = layer_local(dm, Z, Mn)
    y = rows(h, fw["W2"][i])
    if not dm.memory:
        return y, None
    ss = jnp.sum(o * o, axis=(-2, -1))[:, None]  # (B, 1) over every block's heads
    scale = jax.lax.rsqrt(ss / (dm.h * dm.u) + RMS_EPS)
    y_r = rows(r, fw["Wo"][i])
    return y + scale * y_r, (y_r, scale)


def as_f32(M: Array | None) -> Array | None:
    """A stored memory as float32 for the backward's vjps: the memory cotangent stays float32
    and passes the storage rounding unchanged (as autodiff passes a cast)."""
    return None if M is None else M.astype(jnp.float32)
