"""The kernel backends behind one seam: `resolve` turns `model.kernels` into the operations the
fused window is handed (`gpn_jax.core.kernel_ops.MemoryKernels`).

  auto    Pallas on a GPU (once they pass their first-use self-check there,
          `gpn_jax.kernels.selfcheck`; on an H100 they ran the 130M step faster than XLA,
          docs/performance.md, "Measured on one H100"); XLA on a TPU (the Pallas TPU kernels are an explicit
          choice, for per-chip batches whose memory XLA moves through HBM; see `resolve`); the C++
          kernels on a CPU they were measured faster on (AVX-512, or AVX2 with FMA) where they
          build; XLA otherwise. A backend that cannot be used falls back to XLA with one
          warning.
  xla     the reference backend (`gpn_jax.kernels.xla`, the passes as XLA operations) everywhere.
  native  the C++ CPU kernels (`gpn_jax.kernels.cpu`), on any CPU where they build.
  pallas  the Pallas kernels (`gpn_jax.kernels.pallas`, imported only here and only then):
          Triton on a GPU, Mosaic on a TPU, the interpreter on a CPU. On a GPU or TPU each
          pass is first checked against the XLA formulas on that device (`selfcheck`).
An explicit choice that cannot be honoured is a one-line error naming `model.kernels=xla`.

Importing this package loads no JAX (the model configs import it).
"""

import functools
import logging
import os
import subprocess

from gpn_jax.core.kernel_ops import CHOICES, MemoryKernels, check_choice

__all__ = ["CHOICES", "MemoryKernels", "name", "resolve"]

GPU_PLATFORMS = ("gpu", "cuda", "rocm")
_BUILD_ERRORS = (OSError, RuntimeError, subprocess.SubprocessError)
_IGNORED_ENV = "GPN_JAX_NATIVE"


class KernelsUnavailable(ValueError):
    """An explicit `model.kernels` choice this machine cannot run (a one-line message; a
    ValueError, so the entry points report it as a config error)."""


def resolve(choice: str, platform: str, memory_dtype: str = "float32") -> MemoryKernels:
    """The kernels `model.kernels=choice` means on `platform` (`jax.default_backend()`, or the
    platform a step is compiled for) with the memory stored in `memory_dtype`, the reference
    backend `xla` where no other is chosen or usable. Cached: each choice is resolved (and
    built, and warned about) once per process.

    On a TPU `auto` keeps XLA. The choice is per platform, not per batch, and which moves
    less of the memory through HBM depends on the per-chip batch: XLA:TPU keeps M in VMEM at
    small batches and moves it ever more often at large ones, while the Pallas TPU kernels
    move a fixed amount per token and cell (the train step's two forward steps, the
    recomputation's writes, and the backward's one pass reading Ms[t] and dM and writing dM:
    6m + 8 bytes in m-byte storage, `benchmarks.traffic` for the minimum 5m + 8). So
    `model.kernels=pallas` is for per-chip batches where XLA's traffic over M exceeds that
    (compare both with `python -m gpn_jax.aot ... --json`). The fused window runs kernels
    per shard, inside the batch axes' `shard_map`; with tensor parallelism it keeps the XLA
    formulas (`core.kernel_ops`).

    Raises:
      ValueError: an unknown choice.
      KernelsUnavailable: an explicit `native` / `pallas` this machine cannot run.
    """
    check_choice(choice)
    _warn_ignored_env()
    return _resolve(choice, platform, str(memory_dtype))


def name(kernels: MemoryKernels | None) -> str:
    """The resolved choice as run_info records it: "xla", "native" or "pallas"."""
    return "xla" if kernels is None else kernels.name


@functools.cache
def _resolve(choice: str, platform: str, memory_dtype: str) -> MemoryKernels:
    if choice == "native":
        found = _native(platform, explicit=True)
    elif choice == "pallas":
        found = _pallas(platform, memory_dtype, explicit=True)
    elif choice == "auto" and platform in GPU_PLATFORMS:
        found = _pallas(platform, memory_dtype, explicit=False)
    elif choice == "auto" and platform == "cpu" and _cpu_measured_faster():
        found = _native(platform, explicit=False)
    else:
        found = None
    return _xla() if found is None else found


def _xla() -> MemoryKernels:
    from gpn_jax.kernels import xla

    return xla.memory_kernels()


def _cpu_measured_faster() -> bool:
    from gpn_jax.kernels import cpu

    return cpu.measured_faster()


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 300 else text[:150] + " ... " + text[-150:]


def _unavailable(what: str, why: str, explicit: bool) -> None:
    if explicit:
        raise KernelsUnavailable(f"model.kernels={what}: {why}; use --config.model.kernels=xla")
    logging.warning("gpn_jax: %s kernels unavailable, using XLA's (%s)", what, why)


def _native(platform: str, explicit: bool) -> MemoryKernels | None:
    if platform != "cpu":
        _unavailable("native", f"the C++ kernels run on a CPU, not {platform}", explicit)
        return None
    try:
        from gpn_jax.kernels import cpu

        return cpu.memory_kernels()
    except _BUILD_ERRORS as e:
        _unavailable("native", f"the C++ kernels could not be built ({_one_line(e)})", explicit)
        return None


def _pallas(platform: str, memory_dtype: str, explicit: bool) -> MemoryKernels | None:
    """`gpn_jax.kernels.pallas.memory_kernels` built for `platform` (the interpreter on a CPU);
    an ImportError there (a jax too old for its Pallas API) or its refusal of a platform is
    the reason it is unavailable. `memory_dtype` is the storage the window
    asks for; one outside `MEMORY_DTYPES` keeps the window on its XLA formulas (`core.kernel_ops`)."""
    try:
        from gpn_jax.kernels import pallas

        kernels = pallas.memory_kernels(platform=platform)
    except (ImportError, AttributeError, ValueError, RuntimeError, NotImplementedError) as e:
        _unavailable("pallas", f"the Pallas kernels cannot be used ({_one_line(e)})", explicit)
        return None
    if platform != "cpu":  # compiled for this GPU / TPU: checked on it first (`selfcheck`)
        from gpn_jax.kernels import selfcheck

        check = selfcheck.ensure(platform, kernels, memory_dtype)
        if check["status"] == "failed":
            _unavailable("pallas", selfcheck.reason(check), explicit)
            return None
    return kernels


@functools.cache
def _warn_ignored_env() -> None:
    if _IGNORED_ENV in os.environ:
        logging.warning(
            "gpn_jax: %s is ignored; choose the kernels with --config.model.kernels=%s",
            _IGNORED_ENV,
            "|".join(CHOICES),
        )
