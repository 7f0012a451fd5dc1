"""The fused window's per-token products on CPU as a compiled kernel (`small_matmul.cc`).

Inside the fused window's loops every token multiplies the B-row state by the same fused
weight matrices (W0, W2o, the ground gate and their transposes). XLA:CPU runs each such product
through a general matrix multiply that re-packs the weight matrix on every call; here the
matrix is packed once per window (`pack`: column tiles, each contiguous) and a small kernel
streams it (`matmul`), its tiles shared out between the calling thread and XLA's intra-op pool.
`python experiments/window_ab.py` measures what it gains (README, Speed).

The kernel is compiled on first use with the system's C++ compiler (`c++`, or $CXX) against the
FFI headers jaxlib ships, into a private cache keyed by the source, the flags, those headers,
JAX's version and this CPU (`-march=native`; `build_cache` says where, and what it checks
before loading a library) (`built`, which `gpn_jax.native.memory` also uses for its kernels). Compiling at install time
instead would make `pip install` need a compiler and jaxlib's headers in its build environment;
a machine without a compiler (or where the build fails) keeps XLA's products, with one warning.

GPN_JAX_NATIVE: `auto` (default) uses the kernel on x86 CPUs with AVX-512 or with AVX2 and FMA,
the kinds it has been measured faster on (README, Speed); `1` uses it on any CPU (its SSE and
generic builds compute the same products, tested, but their speed is unmeasured); `0` never.
"""

import ctypes
import dataclasses
import functools
import hashlib
import logging
import os
import platform
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp

from gpn_jax.native import build_cache, cpu

Array = jax.Array

SOURCE = Path(__file__).with_suffix(".cc")
FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-std=c++17", "-shared", "-fPIC", "-w")
TARGET = "gpn_small_matmul"


def _cpu_flags() -> set[str]:
    return cpu.flags(cpu.cpuinfo()) or set()


def _setting() -> str:
    value = os.environ.get("GPN_JAX_NATIVE", "auto")
    if value not in ("auto", "0", "1"):
        raise ValueError(f"GPN_JAX_NATIVE must be auto, 0 or 1, got {value!r}")
    return value


def _cpu_id() -> str:
    """What `-march=native` depends on: the CPU's model and flags (Linux), else the machine."""
    text = cpu.cpuinfo()
    if not text:
        return platform.machine() + platform.processor()
    keep = ("model name", "flags", "cpu family", "model\t")
    return "\n".join(sorted({ln for ln in text.splitlines() if ln.startswith(keep)}))


def library_path(source: Path = SOURCE) -> Path:
    """Where the kernel (or another of this package's, `source`) compiled for this source, these
    flags, this JAX (and its FFI headers) and this CPU lives."""
    key = hashlib.sha256()
    for part in (source.read_bytes(), " ".join(FLAGS).encode(), jax.__version__.encode()):
        key.update(part)
    headers = [
        *SOURCE.parent.glob("*.h"),
        *(Path(jax.ffi.include_dir()) / "xla/ffi/api").glob("*.h"),
    ]
    for header in sorted(headers):
        key.update(header.read_bytes())
    key.update(_cpu_id().encode())
    return build_cache.cache_dir() / f"{source.stem}_{key.hexdigest()[:16]}.so"


def build(out: Path, source: Path = SOURCE) -> None:
    """Compiles the kernel (or another version of its `source`) to `out` atomically, its
    digest recorded for `build_cache.trusted` (`build_cache.compile_library`)."""
    includes = [f"-I{SOURCE.parent}", f"-I{jax.ffi.include_dir()}"]
    build_cache.compile_library(out, source, FLAGS, includes)


def built(source: Path = SOURCE) -> Path:
    """The library compiled from `source` for this CPU and JAX: loaded from the private cache
    if trusted there, else (re)built (`build_cache.built`)."""
    return build_cache.built(library_path(source), lambda out: build(out, source))


def register(library: Path, target: str) -> int:
    """Loads a built kernel and registers it as the CPU FFI target `target`: its tile width."""
    lib = ctypes.cdll.LoadLibrary(str(library))
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(lib.GpnSmallMatmul), platform="cpu")
    return int(lib.GpnSmallMatmulTile())


@functools.cache
def _tile() -> int:
    """Columns per packed tile of the loaded kernel (0: no kernel; one warning why)."""
    try:
        return register(built(), TARGET)
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        logging.warning("gpn_jax: native matmul kernel unavailable, using XLA's products (%s)", e)
        return 0


def _wanted() -> bool:
    setting = _setting()
    if setting == "0" or jax.default_backend() != "cpu":
        return False
    return setting == "1" or _measured_faster(_cpu_flags())


def _measured_faster(flags: set[str]) -> bool:
    """The vector units the kernel was measured faster than XLA's products on: AVX-512 (Zen 5)
    and AVX2 with FMA (Zen 3)."""
    return "avx512f" in flags or {"avx2", "fma"} <= flags


def available() -> bool:
    """True when the computation being traced should use the kernel: per GPN_JAX_NATIVE (module
    doc), on CPU, and on one device (the kernel does not say how XLA should partition it over
    a mesh)."""
    if not _wanted():
        return False
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and mesh.size > 1:
        return False
    return _tile() > 0


def status() -> str:
    """What the fused window's per-token products run on here, for benchmark headers."""
    if jax.default_backend() != "cpu":
        return "XLA's (not a CPU)"
    if not _wanted():
        why = (
            "neither AVX-512 nor AVX2+FMA; GPN_JAX_NATIVE=1 for the kernel"
            if _setting() == "auto"
            else "GPN_JAX_NATIVE=0"
        )
        return f"XLA's ({why})"
    tile = _tile()
    return f"native kernel ({tile}-column tiles)" if tile else "XLA's (no native kernel)"


@dataclasses.dataclass(frozen=True)
class Packed:
    """A float32 (K, N) matrix as the kernel reads it: `tiles` (ceil(N / tile), K, tile)."""

    tiles: Array
    n: int  # W's columns


jax.tree_util.register_dataclass(Packed, data_fields=["tiles"], meta_fields=["n"])


def pack(w_KxN: Array) -> Packed:
    """W (K, N) float32 in column tiles of the kernel's width, zero-padded past N."""
    tile = _tile()
    K, N = w_KxN.shape
    n_tiles = -(-N // tile)
    padded = jnp.pad(w_KxN.astype(jnp.float32), ((0, 0), (0, n_tiles * tile - N)))
    return Packed(padded.reshape(K, n_tiles, tile).transpose(1, 0, 2), N)


def matmul(x: Array, w: Packed) -> Array:
    """x (..., K) @ W float32 (..., N) for a `pack`ed W."""
    lead, K = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, K).astype(jnp.float32)
    out = jax.ShapeDtypeStruct((rows.shape[0], w.n), jnp.float32)
    y = jax.ffi.ffi_call(TARGET, out, vmap_method="sequential")(rows, w.tiles)
    return y.reshape(*lead, w.n)
