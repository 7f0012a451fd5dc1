"""Compile-only TPU slices: `gpn_jax.aot --topology=v5e:2x2` (v5p:2x2x1, v6e:1x1, ...)
compiles the train step for that slice on a CPU host with libtpu's compile-only devices
(`jax.experimental.topologies.get_topology_desc`, libtpu the version `jax[tpu]` pins)."""

import contextlib
import importlib.util
import math
import os
import re

# a topology's default chips per host; a smaller topology gets its own size
_HOST_BOUNDS = (2, 2, 1)
_TOPOLOGY = re.compile(r"^(v4|v5e|v5p|v5litepod|v6e):(\d+(?:x\d+){1,2})$")


def libtpu_missing() -> str | None:
    """None when libtpu is importable, else why a TPU compile cannot run and the fix."""
    if importlib.util.find_spec("libtpu") is None:
        return (
            "compiling for a TPU topology needs libtpu: pip install 'jax[tpu]' "
            "(installs the libtpu version this jax pins)"
        )
    return None


def accelerator_type(generation: str, chips: int) -> str:
    """Cloud TPU's name for a slice (`v5litepod-4`); v4 and v5p count two cores per chip."""
    prefix = {"v5e": "v5litepod"}.get(generation, generation)
    return f"{prefix}-{chips * 2 if generation in ('v4', 'v5p') else chips}"


def devices(name: str) -> list:
    """The compile-only devices of TPU topology `name` (e.g. 'v5e:2x2', 'v5p:2x2x1')."""
    m = _TOPOLOGY.match(name.strip())
    if not m:
        raise ValueError(
            f"--topology={name!r}: expected <v4|v5e|v5p|v6e>:<AxB[xC]> (e.g. v5e:2x2, v5p:2x2x1)"
            " or h100, h200, h100:N"
        )
    missing = libtpu_missing()
    if missing:
        raise ValueError(missing)
    import jax
    from jax.experimental import topologies

    jax.config.update("jax_platforms", "cpu")
    dims = [int(d) for d in m.group(2).split("x")] + [1]
    bounds = tuple(min(d, b) for d, b in zip(dims[:3], _HOST_BOUNDS, strict=True))
    chips = math.prod(dims)
    with _libtpu_environ(accelerator_type(m.group(1), chips)):
        desc = topologies.get_topology_desc(name, "tpu", chips_per_host_bounds=bounds)
    return list(desc.devices)


@contextlib.contextmanager
def _libtpu_environ(accelerator: str):
    """The variables libtpu reads when it loads, set for that moment only: a process that goes
    on to start others (a test suite, a notebook) must not hand them a TPU host's environment,
    in which libtpu would probe for a chip and print its failure."""
    wanted = {
        "TPU_SKIP_MDS_QUERY": "1",  # no cloud metadata server to ask
        # libtpu probes the host it loads on for an accelerator type and worker names, and
        # prints its failure to find them on a CPU host: the topology's own type, this host
        "TPU_ACCELERATOR_TYPE": accelerator,
        "TPU_WORKER_HOSTNAMES": "localhost",
        # compile-only: no chip is opened, so other processes may load libtpu at the same time
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    }
    added = [k for k in wanted if k not in os.environ]
    os.environ.update({k: wanted[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)
