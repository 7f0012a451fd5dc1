"""Pallas kernels for the memory's passes (`memory`): GPU (Triton), TPU (Mosaic), and the CPU
through Pallas's interpreter."""

from gpn_jax.kernels.pallas.memory import MEMORY_DTYPES, PallasMemory, memory_kernels

__all__ = ["MEMORY_DTYPES", "PallasMemory", "memory_kernels"]
