"""Device mesh from config and the placement of batches on it.

Axes: `data` (batch), `fsdp` (batch + parameter shards), `tensor` (within-layer splits).
Sizes come from `config.mesh`; -1 takes the remaining devices. Parameter and optimiser-state
shardings come from `gpn_jax.parallel.sharding`; the data-parallel execution of the model
from `gpn_jax.parallel.spmd`.

Multi-host: `jax.devices()` lists every process's devices, so the mesh spans all hosts; each
host places only its own rows of a batch (`put_batch`). With `data` outermost, a host's
devices hold a contiguous block of rows.
"""

import math

import jax
import numpy as np
from jax.sharding import NamedSharding

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


def mesh_shape(mesh_cfg, n_devices: int) -> tuple[int, int, int]:
    """Resolves the (data, fsdp, tensor) sizes; exactly one may be -1 (the rest of the devices)."""
    sizes = [int(mesh_cfg.get(a, 1)) for a in AXES]
    if sizes.count(-1) > 1:
        raise ValueError(
            f"at most one mesh axis may be -1, got {dict(zip(AXES, sizes, strict=True))}"
        )
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if n_devices % known:
            raise ValueError(f"{n_devices} devices do not divide into mesh axes of size {known}")
        sizes[sizes.index(-1)] = n_devices // known
    if math.prod(sizes) != n_devices:
        raise ValueError(
            f"mesh {dict(zip(AXES, sizes, strict=True))} needs {math.prod(sizes)} devices, have {n_devices}"
        )
    return tuple(sizes)


def make_mesh(mesh_cfg, devices=None) -> jax.sharding.Mesh:
    devices = jax.devices() if devices is None else devices
    shape = mesh_shape(mesh_cfg, len(devices))
    # Auto axes: XLA's sharding propagation places intermediates; explicit shardings live at the
    # jit boundary (state, batch), which is all the models need.
    auto = (jax.sharding.AxisType.Auto,) * len(AXES)
    return jax.make_mesh(shape, AXES, axis_types=auto, devices=devices)


def check_batch(mesh, batch_size: int, grad_accum: int = 1) -> None:
    """Each micro-batch must split evenly over the data x fsdp devices."""
    n = math.prod(mesh.shape[a] for a in BATCH_AXES)
    if batch_size % (grad_accum * n):
        raise ValueError(
            f"batch_size {batch_size} does not split into {grad_accum} micro-batch(es) over "
            f"data x fsdp = {n} devices (mesh {dict(mesh.shape)}); use a batch size divisible "
            f"by {grad_accum * n} or set config.mesh"
        )


def batch_sharding(mesh) -> NamedSharding:
    """(B, T) batches: rows split over data x fsdp."""
    return NamedSharding(mesh, jax.P(BATCH_AXES))


def replicated(mesh) -> NamedSharding:
    return NamedSharding(mesh, jax.P())


def put_batch(local_batch: np.ndarray, mesh) -> jax.Array:
    """This process's rows -> the global (B, T) array sharded over the batch axes."""
    return jax.make_array_from_process_local_data(batch_sharding(mesh), local_batch)
