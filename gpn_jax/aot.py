"""Ahead-of-time check: compile a config's train step for an N-device mesh and print memory.

    python -m gpn_jax.aot --config=experiments/configs/gpn_m_1l_130m.py --devices=8 \\
        --mesh=data=2,fsdp=4,tensor=1

Nothing touches an accelerator: N CPU host devices are forced, the train step is built by the
same code as training (`gpn_jax.training.setup.build`, the config's sharding rules),
lowered from abstract inputs (`jax.ShapeDtypeStruct`s carrying their shardings) and compiled.
It prints XLA's per-device memory analysis of the compiled step (parameters + optimiser
state shard, batch shard, outputs, temporaries) and checks that no recurrent loop body holds
a collective over the batch axes. `--mesh` takes `data,fsdp,tensor` sizes (`2,4,1`) or
`axis=size` pairs; without it the config's `mesh` block is used. `--config.train.*` flags
override the batch shape as in training.

The numbers come from the XLA CPU compiler: fusion, layouts and rematerialisation differ on
TPU/GPU, so read them as an estimate of the accelerator's footprint (usually within tens of
per cent), not an exact figure. `--memory_gb` compares the total with a device's memory.
"""

import math
import os
import time

from absl import flags
from ml_collections import config_flags

from gpn_jax import cli

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "ml_collections config file (path.py[:cpu]).",
    allow_override=True,  # tests import several entry points into one process
)
_DEVICES = flags.DEFINE_integer(
    "devices", 8, "Number of devices of the target mesh.", allow_override=True
)
_MESH = flags.DEFINE_string(
    "mesh",
    None,
    "Mesh sizes: 'data,fsdp,tensor' (e.g. 2,4,1) or 'fsdp=4,tensor=2' (rest: data).",
    allow_override=True,
)
_MEMORY_GB = flags.DEFINE_float(
    "memory_gb",
    None,
    "Accelerator memory per device (GiB) to compare the estimate with.",
    allow_override=True,
)
flags.mark_flags_as_required(["config"])

GiB = 1024**3


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


def compile_train_step(config, n_devices: int, mesh_sizes: dict):
    """Compiles `config`'s train step on an `n_devices` mesh from abstract inputs.

    Returns a dict: the compiled step, mesh, model, abstract state, per-device state bytes,
    compile seconds.
    """
    import jax
    import ml_collections

    from gpn_jax.parallel import mesh as meshlib
    from gpn_jax.training import setup

    devices = jax.devices()
    if len(devices) < n_devices:
        raise ValueError(f"{n_devices} devices asked for, JAX has {len(devices)}")
    mesh_cfg = ml_collections.ConfigDict(dict(mesh_sizes))
    mesh = meshlib.make_mesh(mesh_cfg, devices[:n_devices])
    run = setup.build(config, mesh)  # the config's sharding rules, on the asked-for mesh
    abstract, state_sh = run.abstract_state, run.state_shardings
    start = time.perf_counter()
    with jax.set_mesh(mesh):
        compiled = run.train_step.lower(run.state_target(), run.batch_target()).compile()
    seconds = time.perf_counter() - start
    state_bytes = sum(
        math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize
        for a, s in zip(jax.tree.leaves(abstract), jax.tree.leaves(state_sh), strict=True)
    )
    return {
        "compiled": compiled,
        "mesh": mesh,
        "model": run.model,
        "abstract": abstract,
        "state_bytes_per_device": state_bytes,
        "compile_seconds": seconds,
    }


def memory_report(result, memory_gb: float | None = None) -> dict:
    """Per-device bytes from XLA's memory analysis (and the loop-body collective check)."""
    from gpn_jax.parallel import hlo

    m = result["compiled"].memory_analysis()
    report = {
        "arguments": m.argument_size_in_bytes,
        "outputs": m.output_size_in_bytes,
        "aliased": m.alias_size_in_bytes,
        "temporaries": m.temp_size_in_bytes,
        "code": m.generated_code_size_in_bytes,
    }
    report["total"] = (
        report["arguments"] + report["outputs"] - report["aliased"] + report["temporaries"]
    )
    report["state"] = result["state_bytes_per_device"]
    loops = hlo.while_loops(result["compiled"].as_text())
    report["loop_collectives"] = {
        f"{lp.body} ({lp.trip_count} iterations)": dict(lp.collectives)
        for lp in loops
        if lp.collectives
    }
    if memory_gb:
        report["fits"] = report["total"] <= memory_gb * GiB
    return report


def format_report(config, result, report, memory_gb: float | None = None) -> str:
    from gpn_jax.models import accounting

    t = config.train
    mesh = result["mesh"]
    params = accounting.param_counts(result["model"])["total"]
    gib = lambda b: f"{b / GiB:8.3f} GiB" if b >= GiB / 10 else f"{b / 2**20:8.3f} MiB"
    lines = [
        f"{config.model.get('family', 'gpn')} model, {params:,} parameters | batch "
        f"{t.batch_size} x {t.seq_len}, grad_accum {t.grad_accum} | mesh {dict(mesh.shape)} "
        f"on {mesh.size} {mesh.devices.flat[0].platform} devices",
        f"compiled the train step in {result['compile_seconds']:.1f} s",
        "per-device memory (XLA memory analysis of the compiled train step):",
        f"  arguments (state + batch shard) {gib(report['arguments'])}",
        f"    of which train state          {gib(report['state'])}",
        f"  outputs                         {gib(report['outputs'])}",
        f"  aliased (donated state)         {gib(report['aliased'])}",
        f"  temporaries (activations, ...)  {gib(report['temporaries'])}",
        f"  total                           {gib(report['total'])}"
        "   (arguments + outputs - aliased + temporaries)",
    ]
    if memory_gb:
        verdict = "fits" if report["fits"] else "does NOT fit"
        lines.append(f"  -> {verdict} in {memory_gb:g} GiB per device")
    if report["loop_collectives"]:
        lines.append(
            "collectives inside loop bodies (once per iteration; with tensor > 1 these are the"
            " within-layer reductions):"
        )
        lines += [f"  {k}: {v}" for k, v in report["loop_collectives"].items()]
    else:
        lines.append("no collective inside any loop body (weights gathered once per step)")
    return "\n".join(lines)


def _body():
    n = _DEVICES.value
    force_cpu_devices(n)
    config = _CONFIG.value
    sizes = parse_mesh(_MESH.value, config.mesh)
    result = compile_train_step(config, n, sizes)
    report = memory_report(result, _MEMORY_GB.value)
    print(format_report(config, result, report, _MEMORY_GB.value), flush=True)
    return report


main, run = cli.absl_entry(_body, "gpn-aot", quiet=False)


if __name__ == "__main__":
    run()
