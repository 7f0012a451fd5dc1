"""The fused window's passes over the (B, H, K, U) memory on CPU as compiled kernels: each
token's write and read in the forward (`memory_step.cc`), the memory's recomputation for the
backward (`memory_stack.cc`) and the backward's per-token passes (`memory_grad.cc`).

As XLA operations a token's write and read are three passes over the whole memory; the
backward's recomputation (the memory entering each of a
segment's S steps, from its starting memory and the stored write inputs) four per step and a
zero-filled stack; the write's and the read's backward ~11 per step; each over 2 MiB at the
bench's sizes. The kernels take one (b, h) memory at a time while it is in the cache: `step`
reads it twice and writes the new one over it, `stack` keeps it through a segment's writes,
and `grad_reduce` and `grad_update` pass over the step's memory where `stack` wrote it; `grad`
(the seam's one backward pass, `gpn_jax.core.kernel_ops`) composes those two, since on a CPU
the step's memory stays in the cache between them. The reference is `gpn_jax.kernels.xla`.

They are built, cached and loaded as `small_matmul`'s kernel is (`load`), and used by the fused
window with `model.kernels=native` for a memory stored in float32 on one CPU device; the
backward's pass only for one predict layer. `python experiments/bench/window_ab.py`
measures what they gain. Not differentiable (no JVPs): they run inside the fused window's
custom VJP only.
"""

import ctypes
from pathlib import Path

import jax
import jax.numpy as jnp

from gpn_jax.kernels.cpu import small_matmul

_HERE = Path(__file__).parent
# FFI target -> (source, the handler's symbol in its library)
TARGETS = {
    "gpn_memory_step": (_HERE / "memory_step.cc", "GpnMemoryStep"),
    "gpn_memory_stack": (_HERE / "memory_stack.cc", "GpnMemoryStack"),
    "gpn_memory_grad_reduce": (_HERE / "memory_grad.cc", "GpnMemoryGradReduce"),
    "gpn_memory_grad_update": (_HERE / "memory_grad.cc", "GpnMemoryGradUpdate"),
}


_registered: set[str] = set()


def load() -> None:
    """Builds (once per source, CPU and JAX) and registers the kernels.

    Raises:
      RuntimeError, OSError or subprocess.SubprocessError: they cannot be built or loaded.
    """
    for target, (source, symbol) in TARGETS.items():
        if target in _registered:
            continue
        lib = ctypes.cdll.LoadLibrary(str(small_matmul.built(source)))
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), "cpu")
        _registered.add(target)


def _call(target: str, outs, *args, aliases=None):
    load()
    f32 = jnp.float32
    args = [a if a.dtype == jnp.int32 else a.astype(f32) for a in args]
    shapes = tuple(jax.ShapeDtypeStruct(s, f32) for s in outs)
    call = jax.ffi.ffi_call(
        target, shapes, vmap_method="sequential", input_output_aliases=aliases or {}
    )
    return call(*args)


def step(M_BxHxKxU, k_BxHxK, q_BxHxK, v_BxHxU, beta_BxH, eg_BxH):
    """(M', o): one token's write M' = eg M + k (beta (v - M^T k))^T (k l2-normalised) and its
    read o = M'^T q (B, H, U). M' is written over M's buffer."""
    B, H, K, U = M_BxHxKxU.shape
    args = (M_BxHxKxU, k_BxHxK, q_BxHxK, v_BxHxU, beta_BxH, eg_BxH)
    return _call("gpn_memory_step", [(B, H, K, U), (B, H, U)], *args, aliases={0: 0})


def stack(M0_BxHxKxU, k_SxBxHxK, q_SxBxHxK, v_SxBxHxU, beta_SxBxH, eg_SxBxH, keep_SxB):
    """(Ms (S, B, H, K, U), kM, qM (S, B, H, U)): the memory entering each step t (before its
    reset), from M0 and the steps' write inputs, M <- eg Mi + k (beta (v - Mi^T k))^T with
    Mi = keep M (k l2-normalised); kM = Mi^T k and qM = Mi^T q of each step."""
    S = k_SxBxHxK.shape[0]
    U = M0_BxHxKxU.shape[-1]
    n = (S, *M0_BxHxKxU.shape[:2])
    args = (M0_BxHxKxU, k_SxBxHxK, q_SxBxHxK, v_SxBxHxU, beta_SxBxH, eg_SxBxH, keep_SxB)
    return _call("gpn_memory_stack", [(S, *M0_BxHxKxU.shape), (*n, U), (*n, U)], *args)


def grad_reduce(Ms_SxBxHxKxU, t, keep_B, dM_BxHxKxU, k_BxHxK, w_BxHxU):
    """(dM^T k (B, H, U), dM w (B, H, K), <dM, Mi> (B, H)) with Mi = keep Ms[t]."""
    B, H, K, U = dM_BxHxKxU.shape
    t = jnp.asarray(t, jnp.int32)
    args = (Ms_SxBxHxKxU, t, keep_B, dM_BxHxKxU, k_BxHxK, w_BxHxU)
    return _call("gpn_memory_grad_reduce", [(B, H, U), (B, H, K), (B, H)], *args)


def grad_update(
    Ms_SxBxHxKxU, t, keep_B, dM_BxHxKxU, k_BxHxK, q_BxHxK, dkM_BxHxU, dqM_BxHxU, eg_BxH
):
    """(keep (eg dM + k dkM^T + q dqM^T) (B, H, K, U), Mi dkM, Mi dqM (B, H, K)) with
    Mi = keep Ms[t]. The first is written over dM's buffer (each entry from the same entry of
    dM), which XLA then need not copy into the backward loop's carry."""
    B, H, K, U = dM_BxHxKxU.shape
    t = jnp.asarray(t, jnp.int32)
    args = (Ms_SxBxHxKxU, t, keep_B, dM_BxHxKxU, k_BxHxK, q_BxHxK, dkM_BxHxU, dqM_BxHxU, eg_BxH)
    outs = [(B, H, K, U), (B, H, K), (B, H, K)]
    return _call("gpn_memory_grad_update", outs, *args, aliases={3: 0})


def grad(
    Ms_SxBxHxKxU, t, keep_B, dM_BxHxKxU, k_BxHxK, q_BxHxK, w_BxHxU, beta_BxH, eg_BxH, dkM_read, dqM
):
    """The fused backward pass of `gpn_jax.core.kernel_ops` composed of the two kernels: on a
    CPU the step's memory stays in the cache between them, so one kernel would save no memory
    traffic. (dM_prev, dM^T k, dM w, <dM, Mi>, Mi dkM, Mi dqM)."""
    dMk, dMw, inner = grad_reduce(Ms_SxBxHxKxU, t, keep_B, dM_BxHxKxU, k_BxHxK, w_BxHxU)
    dkM = dkM_read - beta_BxH[..., None] * dMk  # w = beta (v - kM)
    dM_prev, Mi_dkM, Mi_dqM = grad_update(
        Ms_SxBxHxKxU, t, keep_B, dM_BxHxKxU, k_BxHxK, q_BxHxK, dkM, dqM, eg_BxH
    )
    return dM_prev, dMk, dMw, inner, Mi_dkM, Mi_dqM
