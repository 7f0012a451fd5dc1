"""The memories a segment of the fused window's backward needs, recomputed by a compiled kernel
(`memory_stack.cc`) instead of a `lax.scan` of XLA operations.

`gpn_jax.core.fast_window._recompute_memory` rebuilds, before each segment's reverse loop, the
(B, H, K, U) memory entering each of its S steps from the segment's starting memory and the
stored write inputs. As a scan, XLA:CPU makes four passes over the whole memory per step (and
zero-fills the stack); the kernel keeps each (b, h) memory in the cache through the S steps and
writes each step's memory once. It is built, cached and loaded as `small_matmul`'s kernel is,
and used where that one is (`GPN_JAX_NATIVE`, one CPU device, float32) when the memory is
stored in float32. `python experiments/window_ab.py` measures what it gains (README, Speed).

Not differentiable (it has no JVP): it runs inside the fused window's backward only.
"""

import ctypes
import functools
import logging
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp

from gpn_jax.native import small_matmul

Array = jax.Array

SOURCE = Path(__file__).with_suffix(".cc")
TARGET = "gpn_memory_stack"


@functools.cache
def _loaded() -> bool:
    """Builds (once per source, CPU and JAX) and registers the kernel; False with one warning
    where it cannot be."""
    try:
        path = small_matmul.library_path(SOURCE)
        if not path.exists():
            small_matmul.build(path, SOURCE)
        lib = ctypes.cdll.LoadLibrary(str(path))
        jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.GpnMemoryStack), platform="cpu")
        return True
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        logging.warning("gpn_jax: native memory kernel unavailable, using XLA's scan (%s)", e)
        return False


def available(memory_dtype) -> bool:
    """True when a window whose products use `small_matmul` (`Dims.native`) should also
    recompute its memories here: the memory stored in float32 and the kernel built."""
    return jnp.dtype(memory_dtype) == jnp.float32 and _loaded()


def stack(
    M0_BxHxKxU: Array,
    k_SxBxHxK: Array,
    v_SxBxHxU: Array,
    beta_SxBxH: Array,
    eg_SxBxH: Array,
    keep_SxB: Array,
) -> Array:
    """(S, B, H, K, U): the memory entering each step t (before its reset), from M0 and the
    steps' write inputs: M <- eg (keep M) + k (beta (v - k^T (keep M)))^T (k l2-normalised)."""
    f32 = jnp.float32
    S = k_SxBxHxK.shape[0]
    out = jax.ShapeDtypeStruct((S, *M0_BxHxKxU.shape), f32)
    args = (M0_BxHxKxU, k_SxBxHxK, v_SxBxHxU, beta_SxBxH, eg_SxBxH, keep_SxB)
    return jax.ffi.ffi_call(TARGET, out, vmap_method="sequential")(*(a.astype(f32) for a in args))
