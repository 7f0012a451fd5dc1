"""What one compiled train step says: its JSON record (fits, peak bytes, kernels, the memory's
HBM traffic read off the compiled HLO: `benchmarks.traffic`, operations per token in its
per-token loops: `roofline.loop_ops`) and its text report."""

from gpn_jax.benchmarks.aot.targets import GiB


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
    """The JSON object of one compile: fits, peak bytes, kernels, the memory's traffic, the
    step's bytes and the per-token loops' operations (`loop_op_fields`)."""
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
        "remat_parallel": config.model.get("remat_parallel"),  # GPN's; None for the others
        "scan_unroll": config.model.get("scan_unroll"),
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
    rec.update(loop_op_fields(text, int(config.train.seq_len), per_step, micro * cells))
    for key in ("arguments", "temporaries", "outputs", "aliased"):
        rec[key + "_bytes"] = report[key]
    return rec


def program_fields(hlo_text: str, seq_len: int, batch: int, elements: int) -> dict:
    """A device run's own compiled step (one micro-batch of `batch` sequences): `loop_op_fields`
    and the memory matrix's HBM bytes per token as compiled (`traffic.hlo_bytes`)."""
    from gpn_jax.benchmarks import traffic

    memory = traffic.hlo_bytes(hlo_text, elements).bytes if elements else None
    return loop_op_fields(hlo_text, seq_len, batch, elements) | {
        "memory_bytes_per_token_hlo": None if memory is None else memory / (batch * seq_len)
    }


def loop_op_fields(hlo_text: str, seq_len: int, batch: int, elements: int) -> dict:
    """Operations per token in the compiled step's per-token loop bodies, forward and
    backward (`roofline.loop_ops`; the latency term of the roofline), and what the step moves
    as compiled: HBM bytes per token over every array (`traffic.op_bytes`) and, by kind of
    operation, the per-token loops' operations and bytes (`roofline.loop_kinds`). `batch`:
    the sequences a step runs per device; `elements`: its memory's size (0 without one)."""
    from gpn_jax.benchmarks import roofline, traffic

    ops = roofline.loop_ops(hlo_text, seq_len)
    moved = traffic.hlo_bytes(hlo_text, elements, every_array=True).bytes
    return {
        "ops_per_token": ops["ops_per_token"],
        "forward_ops_per_token": ops["forward_ops_per_token"],
        "backward_ops_per_token": ops["backward_ops_per_token"],
        "per_token_loops": ops["loops"],
        "bytes_per_token_hlo": moved / (batch * seq_len),
        "per_token_loop_kinds": roofline.loop_kinds(hlo_text, seq_len, batch, elements),
    }
