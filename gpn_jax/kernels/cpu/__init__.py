"""Compiled CPU kernels (C++ through XLA's FFI) for the passes XLA's own CPU code runs slower:
the fused window's per-token products (`small_matmul`) and its passes over the memory
(`memory`). Built on first use with the system's C++ compiler and cached per CPU.

`memory_kernels()` is this backend's `MemoryKernels` (`model.kernels=native`);
`gpn_jax.kernels.resolve` picks it on CPUs it was measured faster on (`measured_faster`).
"""

from gpn_jax.core.kernel_ops import MemoryKernels, ProductKernel
from gpn_jax.kernels.cpu import cpu, memory, small_matmul


def measured_faster() -> bool:
    """Whether this CPU has the vector units the kernels were measured faster than XLA's
    operations on: AVX-512, or AVX2 with FMA."""
    return small_matmul.measured_faster(cpu.flags(cpu.cpuinfo()) or set())


def memory_kernels() -> MemoryKernels:
    """The C++ kernels, built (once per source, CPU and JAX) and registered.

    Raises:
      RuntimeError, OSError or subprocess.SubprocessError: they cannot be built or loaded.
    """
    small_matmul.load()
    memory.load()
    return MemoryKernels(
        name="native",
        step=memory.step,
        stack=memory.stack,
        grad=memory.grad,
        memory_dtypes=("float32",),
        matmul=ProductKernel(small_matmul.pack, small_matmul.matmul),
    )
