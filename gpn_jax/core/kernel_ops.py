"""The seam between the fused window and the kernel backends: the operations core is handed.

`core` never imports a backend. A model resolves `model.kernels` once (`gpn_jax.kernels.resolve`)
and hands the resulting `MemoryKernels` to the fused window, which calls `step`, `stack` and
`grad` for the memory's passes; `model.kernels=xla` hands it the reference backend
(`gpn_jax.kernels.xla`, the passes as XLA operations, against which every other backend is
tested). Where the kernels do not cover a case (a memory dtype outside `memory_dtypes`, more
than one predict layer for the backward's per-token pass, a window split over an automatic mesh
axis such as tensor parallelism) the window differentiates the model's write
(`core.gpn.delta_write`) itself; under `shard_map` the kernels run per shard.

Shapes (B batch rows, H heads, K key width, U value width, S steps of a segment):
  step(M, k, q, v, beta, eg) -> (M_new, o)
      M (B, H, K, U) in the storage dtype; k, q (B, H, K); v (B, H, U); beta, eg (B, H).
      M_new = the model's write (`core.gpn.delta_write`) in M's dtype, o = M_new^T q (B, H, U)
      float32 from the stored M_new.
  stack(M0, k, q, v, beta, eg, keep) -> (Ms, kM, qM)
      the step inputs with a leading S axis, keep (S, B): Ms (S, B, H, K, U) in M0's dtype, the
      memory entering each step before its reset; with Mi = keep Ms[t], kM = Mi^T k and
      qM = Mi^T q (S, B, H, U) float32.
  grad(Ms, t, keep_B, dM, k, q, w, beta, eg, dkM_read, dqM)
      -> (dM_prev (B, H, K, U), dM^T k (B, H, U), dM w (B, H, K), <dM, Mi> (B, H),
          Mi dkM (B, H, K), Mi dqM (B, H, K))
      the backward of step t's write M' = eg Mi + k w^T, w = beta (v - kM), and its read
      o = eg qM + (q . k) w (`core.gpn.delta_factored`), in ONE pass over the memory: dM is
      the cotangent of M'; dkM_read and dqM the cotangents of kM and qM from the read (known
      before the pass), so that the pass forms kM's whole cotangent
      dkM = dkM_read - beta dM^T k itself and dM_prev = keep (eg dM + k dkM^T + q dqM^T).
      t an int32 scalar, keep_B (B,), dM float32; outputs float32.
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

    name: str  # "xla" | "native" | "pallas"
    step: Callable
    stack: Callable
    grad: Callable
    memory_dtypes: tuple[str, ...]  # storage dtypes the kernels take
    matmul: ProductKernel | None = None  # the CPU product kernel, or None


def check_choice(choice: str) -> None:
    """Raises a one-line ValueError unless `choice` is one of `CHOICES`."""
    if choice not in CHOICES:
        raise ValueError(
            f"model.kernels must be one of {', '.join(CHOICES)}, got {choice!r} "
            "(e.g. --config.model.kernels=xla)"
        )
