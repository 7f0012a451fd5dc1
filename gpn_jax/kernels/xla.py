"""The reference backend: the memory's passes (`gpn_jax.core.kernel_ops.MemoryKernels`) as XLA
operations, the one place their formulas are written as array code outside the model itself.

The write is the model's (`gpn_jax.core.gpn.delta_write`: float32 arithmetic, the new memory
rounded to M's dtype), the read is from the stored memory; `grad` is the hand-derived backward
of one step's write and read in the factored form the fused window uses (kernel_ops's module
doc). Every other backend (C++, Pallas GPU, Pallas TPU) is tested against these functions, the
Pallas bench times them, and `model.kernels=xla` hands them to the fused window.

Shapes as in `kernel_ops`; every function takes any storage dtype.
"""

import jax
import jax.numpy as jnp

from gpn_jax.core.gpn import delta_write
from gpn_jax.core.kernel_ops import MemoryKernels

F32 = jnp.float32
MEMORY_DTYPES = ("float32", "bfloat16", "float16")


def col_sum(x, M):
    """x^T M per (b, h): (..., K), (..., K, U) -> (..., U)."""
    return jnp.einsum("...k,...ku->...u", x, M)


def row_sum(M, y):
    """M y per (b, h): (..., K, U), (..., U) -> (..., K)."""
    return jnp.einsum("...ku,...u->...k", M, y)


def _rows(x, like):
    """A per-row (B,) or per-(b, h) factor shaped to broadcast against `like`."""
    return x.reshape(x.shape + (1,) * (like.ndim - x.ndim))


def step(M, k, q, v, beta, eg):
    """(M', o): the write M' = eg M + k (beta (v - M^T k))^T in M's dtype and the read
    o = M'^T q (float32) from the stored M'."""
    Mn = delta_write(M, k, v, beta, eg)
    return Mn, col_sum(q, Mn.astype(F32))


def stack(M0, k, q, v, beta, eg, keep):
    """(Ms, kM, qM): a scan of the stored writes; Ms[t] the memory entering step t before its
    reset, kM = Mi^T k and qM = Mi^T q with Mi = keep Ms[t]."""

    def body(M, x):
        kt, qt, vt, bt, et, kp = x
        Mi = M * _rows(kp, M).astype(M.dtype)  # keep is 0 / 1: exact in storage
        Mf = Mi.astype(F32)
        return delta_write(Mi, kt, vt, bt, et), (M, col_sum(kt, Mf), col_sum(qt, Mf))

    return jax.lax.scan(body, M0, (k, q, v, beta, eg, keep.astype(F32)))[1]


def grad(Ms, t, keep_B, dM, k, q, w, beta, eg, dkM_read, dqM):
    """The backward of step t's write and read in one pass over the memory (kernel_ops)."""
    Mi = Ms[t].astype(F32) * _rows(keep_B, dM)
    dMk = col_sum(k, dM)
    dkM = dkM_read - _rows(beta, dMk) * dMk  # w = beta (v - kM)
    dM_prev = _rows(keep_B, dM) * (
        _rows(eg, dM) * dM
        + k[..., :, None] * dkM[..., None, :]
        + q[..., :, None] * dqM[..., None, :]
    )
    inner = jnp.sum(dM * Mi, axis=(-2, -1))
    return dM_prev, dMk, row_sum(dM, w), inner, row_sum(Mi, dkM), row_sum(Mi, dqM)


def memory_kernels() -> MemoryKernels:
    """The reference passes as a backend (`model.kernels=xla`)."""
    return MemoryKernels("xla", step, stack, grad, MEMORY_DTYPES)
