"""Ahead-of-time compiles of a config's train step: on N forced CPU devices, or for a TPU
topology from a CPU host (libtpu's compile-only devices), with per-device memory and the
memory's HBM traffic read off the compiled step (`benchmarks.traffic`).

`compile_train_step` builds the step with the code training uses (`training.setup.build`,
the config's sharding rules) on a mesh over the given devices, lowers it from abstract inputs
and compiles it. For a TPU topology the devices come from
`jax.experimental.topologies.get_topology_desc` (libtpu, the version `jax[tpu]` pins), and a
compile that runs out of HBM is a result (`fits: false`, XLA's message), not an error.
"""

import contextlib
import importlib.util
import math
import os
import re
import time

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
# a topology's default chips per host; a smaller topology gets its own size
_HOST_BOUNDS = (2, 2, 1)
_TOPOLOGY = re.compile(r"^(v4|v5e|v5p|v5litepod|v6e):(\d+(?:x\d+){1,2})$")
_OOM = ("resource_exhausted", "ran out of memory", "out of memory")


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


def topology_devices(name: str) -> list:
    """The compile-only devices of TPU topology `name` (e.g. 'v5e:2x2', 'v5p:2x2x1') or of
    NVIDIA GPUs ('h100', 'h200', 'h100:8': `gpu_target`)."""
    from gpn_jax.benchmarks import gpu_target

    if gpu_target.is_gpu_name(name):
        return gpu_target.devices(name)
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


@contextlib.contextmanager
def _uncached(compile_only: bool):
    """No persistent-cache entry for an executable of compile-only devices (a TPU topology's):
    JAX cannot load one back and warns about it on every later compile of the program."""
    import jax

    if not compile_only:
        yield
        return
    before = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", math.inf)
    try:
        yield
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before)


def hbm_bytes(device) -> int | None:
    """Memory per device from its kind: a TPU chip's HBM (`HBM_BYTES`), a GPU's share that
    the JAX client may allocate (`gpu_target`); None for a kind in neither."""
    from gpn_jax.benchmarks import gpu_target

    kind = getattr(device, "device_kind", "")
    return HBM_BYTES.get(kind) or gpu_target.usable_bytes(kind)


def _out_of_memory(error: Exception) -> bool:
    return any(m in str(error).lower() for m in _OOM)


def compile_train_step(config, devices: list, mesh_sizes: dict):
    """Compiles `config`'s train step on a mesh over `devices` from abstract inputs.

    Returns a dict: the compiled step (None when the compile ran out of device memory, with
    `oom` holding XLA's message), mesh, model, abstract state, per-device state bytes, compile
    seconds.
    """
    import jax
    import ml_collections

    from gpn_jax.models import factory
    from gpn_jax.parallel import mesh as meshlib
    from gpn_jax.training import setup

    mesh = meshlib.make_mesh(ml_collections.ConfigDict(dict(mesh_sizes)), devices)
    # the kernels resolved for the devices compiled for, not for this host
    model = factory.build_model(config.model)
    if hasattr(model, "on_platform"):
        model = model.on_platform(devices[0].platform)
    run = setup.build(config, mesh, model=model)  # the config's sharding rules, on that mesh
    abstract, state_sh = run.abstract_state, run.state_shardings
    start, compiled, oom = time.perf_counter(), None, None
    with jax.set_mesh(mesh), _uncached(devices[0].platform != jax.default_backend()):
        lowered = run.train_step.lower(run.state_target(), run.batch_target())
        try:
            compiled = lowered.compile()
        except Exception as e:  # noqa: BLE001 - only an out-of-memory compile is a result
            if not _out_of_memory(e):
                raise
            oom = str(e).strip().splitlines()[0][:500]
    state_bytes = sum(
        math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize
        for a, s in zip(jax.tree.leaves(abstract), jax.tree.leaves(state_sh), strict=True)
    )
    return {
        "compiled": compiled,
        "oom": oom,
        "mesh": mesh,
        "model": run.model,
        "kernels": setup.resolved_kernels(run.model),
        "abstract": abstract,
        "state_bytes_per_device": state_bytes,
        "compile_seconds": time.perf_counter() - start,
    }


def memory_report(result, memory_bytes: int | None = None) -> dict:
    """Per-device bytes from XLA's memory analysis (and the loop-body collective check)."""
    from gpn_jax.parallel import hlo

    compiled = result["compiled"]
    if compiled is None:
        return {"total": None, "fits": False, "oom": result["oom"], "loop_collectives": {}}
    m = compiled.memory_analysis()
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
    loops = hlo.while_loops(compiled.as_text())
    report["loop_collectives"] = {
        f"{lp.body} ({lp.trip_count} iterations)": dict(lp.collectives)
        for lp in loops
        if lp.collectives
    }
    if memory_bytes:
        report["fits"] = report["total"] <= memory_bytes
    return report


def format_report(config, result, report, memory_bytes: int | None = None) -> str:
    from gpn_jax.models import accounting, factory

    t = config.train
    mesh = result["mesh"]
    params = accounting.param_counts(result["model"])["total"]
    gib = lambda b: f"{b / GiB:8.3f} GiB" if b >= GiB / 10 else f"{b / 2**20:8.3f} MiB"
    head = [
        f"{factory.family_name(config.model)} model, {params:,} parameters | batch "
        f"{t.batch_size} x {t.seq_len}, grad_accum {t.grad_accum} | mesh {dict(mesh.shape)} "
        f"on {mesh.size} {mesh.devices.flat[0].platform} devices",
        f"compiled the train step in {result['compile_seconds']:.1f} s",
    ]
    if result["compiled"] is None:
        return "\n".join(head + [f"  -> does NOT fit: {result['oom']}"])
    lines = head + [
        "per-device memory (XLA memory analysis of the compiled train step):",
        f"  arguments (state + batch shard) {gib(report['arguments'])}",
        f"    of which train state          {gib(report['state'])}",
        f"  outputs                         {gib(report['outputs'])}",
        f"  aliased (donated state)         {gib(report['aliased'])}",
        f"  temporaries (activations, ...)  {gib(report['temporaries'])}",
        f"  total                           {gib(report['total'])}"
        "   (arguments + outputs - aliased + temporaries)",
    ]
    if memory_bytes:
        verdict = "fits" if report["fits"] else "does NOT fit"
        lines.append(f"  -> {verdict} in {memory_bytes / GiB:.3g} GiB per device")
    if report["loop_collectives"]:
        lines.append(
            "collectives inside loop bodies (once per iteration; with tensor > 1 these are the"
            " within-layer reductions):"
        )
        lines += [f"  {k}: {v}" for k, v in report["loop_collectives"].items()]
    else:
        lines.append("no collective inside any loop body (weights gathered once per step)")
    return "\n".join(lines)


def batch_shard(config, mesh) -> tuple[int, int]:
    """(sequences per device per step, per micro-batch) on `mesh`'s data and fsdp axes."""
    shape = dict(mesh.shape)
    dp = shape.get("data", 1) * shape.get("fsdp", 1)
    per_step = config.train.batch_size // dp
    return per_step, per_step // config.train.grad_accum


def m_in_vmem(text: str, elements: int, innermost: bool = False) -> bool | None:
    """True when every M-sized array that a while loop carries sits in memory space 1 (VMEM
    on TPU); None when no loop carries one. `innermost`: only the loops whose body runs no
    loop (the per-token loops); the outer ones (per segment) may hold M in HBM."""
    from gpn_jax.benchmarks import traffic

    found = [on_chip for k, on_chip in traffic.loop_carries(text, elements, innermost) if k == 1]
    return None if not found else all(found)


def step_record(config, result, report, memory_bytes: int | None) -> dict:
    """The JSON object of one compile: fits, peak bytes, kernels, the memory's traffic."""
    from gpn_jax.benchmarks import traffic

    mesh = result["mesh"]
    device = mesh.devices.flat[0]
    per_step, micro = batch_shard(config, mesh)
    tensor = dict(mesh.shape).get("tensor", 1)
    cells = traffic.memory_cells(config.model) // tensor
    minimum = traffic.min_bytes_per_token(config.model)  # until the compile shows M on chip
    rec = {
        "platform": device.platform,
        "device_kind": getattr(device, "device_kind", device.platform),
        "devices": int(mesh.size),
        "mesh": {k: int(v) for k, v in dict(mesh.shape).items()},
        "batch_size": int(config.train.batch_size),
        "batch_per_device": per_step,
        "seq_len": int(config.train.seq_len),
        "kernels": result["kernels"],
        "memory_dtype": config.model.get("memory_dtype", "float32"),
        "attention": config.model.get("attention"),  # Transformer++'s; None for the others
        "fits": bool(report.get("fits", report["total"] is not None)),
        "peak_bytes_per_device": report["total"],
        "hbm_bytes_per_device": memory_bytes,
        "compile_seconds": round(result["compile_seconds"], 1),
        "memory_bytes_per_token_min": minimum / tensor if minimum else None,
        "memory_bytes_per_token_hlo": None,
        "m_in_vmem": None,
    }
    if result["compiled"] is None:
        rec["oom"] = result["oom"]
        return rec
    text = result["compiled"].as_text()
    if cells:
        t = traffic.hlo_bytes(text, micro * cells)  # the whole step: every micro-batch
        on_chip = traffic.placement(text, micro * cells)
        rec["memory_on_chip"], rec["stack_on_chip"] = on_chip
        rec["memory_bytes_per_token_min"] = (
            traffic.min_bytes_per_token(config.model, on_chip) / tensor
        )
        rec["memory_bytes_per_token_hlo"] = t.bytes / (per_step * config.train.seq_len)
        rec["unknown_trip_counts"] = t.unknown_trip_counts
        if device.platform == "tpu":  # memory space 1 is a TPU's VMEM
            rec["m_in_vmem"] = m_in_vmem(text, micro * cells)
            rec["m_in_vmem_per_token_loops"] = m_in_vmem(text, micro * cells, innermost=True)
    rec.update(loop_op_fields(text, int(config.train.seq_len)))
    for key in ("arguments", "temporaries", "outputs", "aliased"):
        rec[key + "_bytes"] = report[key]
    return rec


def loop_op_fields(hlo_text: str, seq_len: int) -> dict:
    """Operations per token in the compiled step's per-token loop bodies, forward and
    backward (`roofline.loop_ops`; the latency term of the roofline)."""
    from gpn_jax.benchmarks import roofline

    ops = roofline.loop_ops(hlo_text, seq_len)
    return {
        "ops_per_token": ops["ops_per_token"],
        "forward_ops_per_token": ops["forward_ops_per_token"],
        "backward_ops_per_token": ops["backward_ops_per_token"],
        "per_token_loops": ops["loops"],
    }
