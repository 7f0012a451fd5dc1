"""What every benchmark record shares: platform, dtype, the measured peak, memory, timing."""

import dataclasses
import os
import platform as pyplatform
import resource
import statistics
import time

import jax
import jax.numpy as jnp

from gpn_jax.kernels.cpu import cpu
from gpn_jax.models import factory


def platform() -> str:
    return jax.devices()[0].platform


def device_kind() -> str:
    d = jax.devices()[0]
    kind = getattr(d, "device_kind", d.platform)
    if d.platform == "cpu":
        kind = f"{_cpu_model()} x {os.cpu_count()} cores"
    return kind


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


# Vector / matrix extensions worth naming in a report (x86 /proc/cpuinfo `flags`, Arm `Features`).
_VECTOR_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "asimdhp",
    "sve",
    "sve2",
    "bf16",
    "i8mm",
)


def cpu_vector_extensions(cpuinfo: str | None = None) -> str:
    """The CPU's vector extensions that matter for matmul speed ('avx2 fma', 'avx512f ... amx_bf16'),
    from the first `flags` / `Features` line of /proc/cpuinfo; elsewhere the machine name."""
    have = cpu.flags(cpu.cpuinfo() if cpuinfo is None else cpuinfo)
    if have is None:
        return f"unknown ({pyplatform.machine() or 'no /proc/cpuinfo'})"
    found = [x for x in _VECTOR_FLAGS if x in have]
    return " ".join(found) or "none of " + " ".join(_VECTOR_FLAGS[:5])


def resolve_dtype(name: str) -> str:
    """'auto' -> float32 on CPU, bfloat16 on GPU / TPU; anything else as given."""
    if name == "auto":
        return "float32" if platform() == "cpu" else "bfloat16"
    jnp.dtype(name)
    return name


def build_model(model_cfg: dict, compute_dtype: str, **overrides):
    """Model object from a config block; `compute_dtype` and `overrides` set where the family has them."""
    fields = dict(model_cfg)
    model_cls, cfg = factory.model_config(fields)
    known = {f.name for f in dataclasses.fields(cfg)}
    updates = {k: v for k, v in overrides.items() if k in known}
    if "compute_dtype" in known:
        updates["compute_dtype"] = compute_dtype
    return model_cls(dataclasses.replace(cfg, **updates))


# ----------------------------------------------------------------------------- peak
def peak_matmul_flops(dtype: str, size: int = 0, reps: int = 5) -> float:
    """Best FLOP/s of a large jitted square matmul in `dtype` (the machine's matmul peak, measured).

    Several repetitions, best one kept: on a shared machine the peak is what the hardware
    reaches when it is not interrupted.
    """
    if not size:
        size = 2048 if platform() == "cpu" else 8192
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    a = jax.random.normal(k1, (size, size), jnp.float32).astype(dtype)
    b = jax.random.normal(k2, (size, size), jnp.float32).astype(dtype)
    f = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))
    f(a, b).block_until_ready()
    # several products per timing so a fast accelerator is not dominated by dispatch
    inner = 1 if platform() == "cpu" else 10
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(inner):
            out = f(a, b)
        out.block_until_ready()
        best = min(best, (time.perf_counter() - t) / inner)
    return 2 * size**3 / best


# ----------------------------------------------------------------------------- bandwidth
def memory_bandwidth(size_mib: int = 0, reps: int = 5) -> float:
    """The machine's memory bandwidth, measured like `peak_matmul_flops`: best bytes/s of a
    jitted JAX `x <- -x` over a large float32 array (STREAM "scale": every element read once
    and written once, so bytes = 2 x the array); default 256 MiB on CPU (far beyond the
    caches), 2 GiB on GPU / TPU."""
    if not size_mib:
        size_mib = 256 if platform() == "cpu" else 2048
    n = size_mib * 2**20 // 4
    # donated: the result reuses the input's buffer, so no call pays for touching fresh pages
    # (without it a 256 MiB output costs page faults that read as a 10x lower bandwidth on CPU)
    f = jax.jit(lambda x: x * -1.0, donate_argnums=0)  # never overflows
    x = f(jnp.ones((n,), jnp.float32)).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        x = f(x).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * n * 4 / best


# ----------------------------------------------------------------------------- memory
def host_rss_bytes() -> int:
    """Current resident set size of this process."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def peak_host_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_memory_bytes() -> tuple[int, str]:
    """(bytes, what): device peak (`memory_stats`) on GPU / TPU, peak host RSS on CPU."""
    if platform() != "cpu":
        stats = jax.devices()[0].memory_stats() or {}
        if "peak_bytes_in_use" in stats:
            return int(stats["peak_bytes_in_use"]), "device peak_bytes_in_use"
    return peak_host_rss_bytes(), "peak host RSS"


# ----------------------------------------------------------------------------- timing
def time_calls(fn, n: int) -> list[float]:
    """Wall seconds of `n` calls of `fn()` (each result waited for)."""
    out = []
    for _ in range(n):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        out.append(time.perf_counter() - t)
    return out


def median(xs):
    return statistics.median(xs) if xs else float("nan")
