"""Pallas kernels for the memory's passes: `gpu` (GPU via Triton, and the CPU through Pallas's
interpreter) and `tpu` (TPU via Mosaic, or Pallas's TPU interpreter), both built by
`memory_kernels(platform=...)` as a `gpn_jax.core.kernel_ops.MemoryKernels`."""

from gpn_jax.kernels.pallas.gpu import MEMORY_DTYPES, memory_kernels

__all__ = ["MEMORY_DTYPES", "memory_kernels"]
