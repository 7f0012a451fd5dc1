"""What a compile is for: its devices (N forced CPU devices, a TPU slice's or NVIDIA GPUs'
compile-only devices: `tpus`, `gpus`), the memory per device its peak is held against, and the
mesh's axis sizes (`--mesh` or the config's mesh block)."""

import os

GiB = 1024**3
# HBM per chip by `device_kind` (the chips' data sheets: v5e 16 GiB, v5p 95 GiB, v6e 32 GiB,
# v4 32 GiB). XLA:TPU's own out-of-memory message names the usable amount.
HBM_BYTES = {
    "TPU v4": 32 * GiB,
    "TPU v5 lite": 16 * GiB,
    "TPU v5": 95 * GiB,
    "TPU v5p": 95 * GiB,
    "TPU v6 lite": 32 * GiB,
}


def parse_mesh(text: str | None, mesh_cfg) -> dict:
    """`--mesh` (or the config's mesh block) -> {'data': d, 'fsdp': f, 'tensor': t} (-1 allowed)."""
    from gpn_jax.parallel.mesh import AXES

    if not text:
        return {a: int(mesh_cfg.get(a, 1)) for a in AXES}
    text = text.strip()
    if "=" not in text:
        sizes = [int(x) for x in text.split(",")]
        if len(sizes) != len(AXES):
            raise ValueError(f"--mesh needs {len(AXES)} sizes (data,fsdp,tensor), got {text!r}")
        return dict(zip(AXES, sizes, strict=True))
    out = {"data": -1, "fsdp": 1, "tensor": 1}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name.strip() not in AXES:
            raise ValueError(f"unknown mesh axis {name!r}; axes are {AXES}")
        out[name.strip()] = int(value)
    return out


def force_cpu_devices(n: int) -> None:
    """Make JAX see at least `n` CPU devices; must run before the backend starts."""
    import jax

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        jax.config.update("jax_num_cpu_devices", n)
    jax.config.update("jax_platforms", "cpu")


def topology_devices(name: str) -> list:
    """The compile-only devices of TPU topology `name` (e.g. 'v5e:2x2', 'v5p:2x2x1': `tpus`) or
    of NVIDIA GPUs ('h100', 'h200', 'h100:8': `gpus`)."""
    from gpn_jax.benchmarks.aot import gpus, tpus

    if gpus.is_gpu_name(name):
        return gpus.devices(name)
    return tpus.devices(name)


def hbm_bytes(device) -> int | None:
    """Memory per device from its kind: a TPU chip's HBM (`HBM_BYTES`), a GPU's share that
    the JAX client may allocate (`gpus`); None for a kind in neither."""
    from gpn_jax.benchmarks.aot import gpus

    kind = getattr(device, "device_kind", "")
    return HBM_BYTES.get(kind) or gpus.usable_bytes(kind)
