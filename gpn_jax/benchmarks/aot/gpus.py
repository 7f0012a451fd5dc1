"""Compile-only NVIDIA GPUs: `gpn_jax.aot --topology=h100` (or `h200`, `h100:8`) compiles the
train step for sm_90 on a host without a GPU, as `v5e:2x2` does for a TPU slice.

XLA:GPU compiles for a device it is told about: the CUDA plugin's topology takes a target
description (`GpuTargetConfigProto`, text format: the SM's limits, memory size and bandwidth,
the cuDNN version) and gives compile-only devices whose executables are never run. What it
needs on the host: Python 3.12 with jax 0.11, the CUDA 13 plugin and its compiler wheels
(nvcc's ptxas, nvvm, cuDNN), one command in a 3.12 venv: `pip install -e ".[gpu]"`.

The figures below are the devices' own (the lent H100's runtime, nvidia-smi, the data sheets
in `roofline.DEVICE_SPECS`), written once here and read by the fit check (`targets`), the
device run's plan (`experiments/bench/accel_plan.py`) and the target description. An
executable compiled this way has the device's memory analysis: the 130M GPN+M step's compiled
peak is the one the H100 run measured within 5 % (`aot_130m_h100_gpn_m.json` beside
`accel_h100_step.json`, tests/benchmarks/test_aot.py).
"""

import dataclasses
import importlib.util
import os
import re

from gpn_jax.benchmarks import roofline
from gpn_jax.io import provenance

_NAME = re.compile(r"^(h100|h200)(?::(\d+))?$")
MEM_FRACTION = 0.75  # XLA_PYTHON_CLIENT_MEM_FRACTION's default: the JAX client's share


@dataclasses.dataclass(frozen=True)
class Gpu:
    device_kind: str  # as the CUDA runtime names it (a device's `device_kind`)
    memory_bytes: int  # device memory the runtime reports
    memory_source: str

    @property
    def usable_bytes(self) -> int:
        """What the JAX client may allocate: its memory fraction of the device's memory
        (`XLA_PYTHON_CLIENT_MEM_FRACTION` where set, else 0.75)."""
        return int(mem_fraction() * self.memory_bytes)


GPUS = {
    # the lent H100's client limit (versions.json `bytes_limit` 63,763,906,560) / 0.75
    "h100": Gpu("NVIDIA H100 80GB HBM3", 85_018_542_080, "the H100 run's runtime (bytes_limit / 0.75)"),
    # nvidia-smi's memory.total on the lent H200 (143,771 MiB); on the H100 the runtime's
    # total was 0.6 % below nvidia-smi's, so a fit within 1 % of the line is marginal
    "h200": Gpu("NVIDIA H200", 143_771 * 2**20, "nvidia-smi on the lent H200 (143,771 MiB)"),
}  # fmt: skip

# The Hopper SM (sm_90) as the CUDA device query reports it on an H100 / H200 SXM: 132 SMs,
# 228 KiB of shared memory per SM (227 KiB to one block), 64K registers, 50 MiB of L2.
_HOPPER = {
    "threads_per_block_limit": 1024,
    "threads_per_warp": 32,
    "shared_memory_per_block": 48 * 1024,
    "shared_memory_per_core": 228 * 1024,
    "shared_memory_per_block_optin": 227 * 1024,
    "threads_per_core_limit": 2048,
    "core_count": 132,
    "fpus_per_core": 128,
    "block_dim_limit_x": 2**31 - 1,
    "block_dim_limit_y": 65535,
    "block_dim_limit_z": 65535,
    "l2_cache_size": 50 * 2**20,
    "clock_rate_ghz": 1.98,
    "registers_per_core_limit": 65536,
    "registers_per_block_limit": 65536,
}
_CUDNN = (9, 10, 0)  # the cuDNN the plugin's wheels bring is newer; 9.x's fused attention


def mem_fraction() -> float:
    raw = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    try:
        value = float(raw) if raw else MEM_FRACTION
    except ValueError:
        return MEM_FRACTION
    return value if 0 < value <= 1 else MEM_FRACTION


def target_config(kind: str) -> str:
    """The `GpuTargetConfigProto` text of `kind` (h100 | h200)."""
    gpu = GPUS[kind]
    fields = _HOPPER | {
        "memory_bandwidth": int(roofline.DEVICE_SPECS[kind].bandwidth),
        "device_memory_size": gpu.memory_bytes,
    }
    info = "\n".join(f"  {k}: {v}" for k, v in fields.items())
    major, minor, patch = _CUDNN
    return (
        f"gpu_device_info {{\n{info}\n  cuda_compute_capability {{ major: 9 minor: 0 }}\n}}\n"
        f'platform_name: "CUDA"\n'
        f"dnn_version_info {{ major: {major} minor: {minor} patch: {patch} }}\n"
        f'device_description_str: "{gpu.device_kind}"\n'
    )


def is_gpu_name(name: str) -> bool:
    return bool(_NAME.match(name.strip().lower()))


def toolchain_missing() -> str | None:
    """None when the CUDA plugin and its compiler wheels are installed, else the fix."""
    plugins = importlib.util.find_spec("jax_plugins") is not None  # JAX's plugin namespace
    plugin = plugins and any(importlib.util.find_spec(f"jax_plugins.xla_cuda{v}") for v in (13, 12))
    if plugin and any(_installed(d) for d in ("nvidia-cuda-nvcc", "nvidia-cuda-nvcc-cu12")):
        return None
    return (
        "compiling for a GPU from this host needs the CUDA plugin and its compiler wheels: in a "
        'Python 3.12 venv, pip install -e ".[gpu]" (docs/usage.md, "Compiling for a GPU")'
    )


def _installed(distribution: str) -> bool:
    return provenance.installed_version(distribution) is not None


def devices(name: str) -> list:
    """The compile-only devices of `h100`, `h200` or `h100:N` (N GPUs of one host)."""
    m = _NAME.match(name.strip().lower())
    if not m:
        raise ValueError(f"--topology={name!r}: expected h100, h200 or h100:N (N GPUs)")
    missing = toolchain_missing()
    if missing:
        raise ValueError(missing)
    import jax
    from jax.experimental import topologies

    jax.config.update("jax_platforms", "cpu")  # this host's own devices stay the CPU's
    count = int(m.group(2) or 1)
    desc = topologies.get_topology_desc(
        platform="cuda", target_config=target_config(m.group(1)), topology=f"1x1x{count}"
    )
    return list(desc.devices)


def usable_bytes(device_kind: str) -> int | None:
    """What the JAX client may allocate on a GPU of `device_kind` (None: not one of ours)."""
    for gpu in GPUS.values():
        if gpu.device_kind == device_kind:
            return gpu.usable_bytes
    return None
