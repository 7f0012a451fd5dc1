"""The seam between the fused window and the kernel backends: the operations core is handed.

`core` never imports a backend. A model resolves `model.kernels` once (`gpn_jax.kernels.resolve`)
and hands the resulting `MemoryKernels` (or None: the XLA formulas) to the fused window, which
calls `step`, `stack`, `grad_reduce` and `grad_update` where it would otherwise run the same
passes as XLA operations. Where the kernels do not cover a case (a memory dtype outside
`memory_dtypes`, no `grad_reduce` / `grad_update`, more than one predict layer or remat for the
backward's per-token passes, a mesh axis of more than one device that is not manual: the
kernels run per shard inside a `shard_map` over the batch axes, never partitioned by XLA) the
window uses its XLA formulas.

Shapes (B batch rows, H heads, K key width, U value width, S steps of a segment):
  step(M, k, q, v, beta, eg) -> (M_new, o)
      M (B, H, K, U) in the storage dtype; k, q (B, H, K); v (B, H, U); beta, eg (B, H).
      M_new = eg M + k (beta (v - M^T k))^T in M's dtype, o = M_new^T q (B, H, U) float32.
  stack(M0, k, q, v, beta, eg, keep) -> (Ms, kM, qM)
      the step inputs with a leading S axis, keep (S, B): Ms (S, B, H, K, U) in M0's dtype, the
      memory entering each step before its reset; with Mi = keep Ms[t], kM = Mi^T k and
      qM = Mi^T q (S, B, H, U) float32.
  grad_reduce(Ms, t, keep_B, dM, k, w) -> (dM^T k (B, H, U), dM w (B, H, K), <dM, Mi> (B, H))
  grad_update(Ms, t, keep_B, dM, k, q, dkM, dqM, eg)
      -> (keep (eg dM + k dkM^T + q dqM^T) (B, H, K, U), Mi dkM, Mi dqM (B, H, K))
      t an int32 scalar, keep_B (B,), dM the memory's float32 cotangent; outputs float32.
JAX-free at import (the model configs read `CHOICES`).
"""

from collections.abc import Callable
from typing import NamedTuple

# `model.kernels`: auto (per platform, `gpn_jax.kernels.resolve`), the XLA formulas, the C++
# CPU kernels or the Pallas kernels.
CHOICES = ("auto", "xla", "native", "pallas")


class ProductKernel(NamedTuple):
    """A kernel for the per-token products x @ W by a weight matrix packed once per window."""

    pack: Callable  # W (K, N) float32 -> the kernel's packed operand (a pytree)
    matmul: Callable  # (x (..., K), packed W) -> x @ W float32 (..., N)


class MemoryKernels(NamedTuple):
    """A backend's implementation of the memory's passes (module doc); hashable, so that it
    can sit in the window's static `Dims`."""

    name: str  # "native" | "pallas"
    step: Callable
    stack: Callable
    grad_reduce: Callable | None
    grad_update: Callable | None
    memory_dtypes: tuple[str, ...]  # storage dtypes the kernels take
    matmul: ProductKernel | None = None  # the CPU product kernel, or None


def check_choice(choice: str) -> None:
    """Raises a one-line ValueError unless `choice` is one of `CHOICES`."""
    if choice not in CHOICES:
        raise ValueError(
            f"model.kernels must be one of {', '.join(CHOICES)}, got {choice!r} "
            "(e.g. --config.model.kernels=xla)"
        )
