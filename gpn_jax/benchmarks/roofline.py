"""The roofline of a training step: FLOPs and bytes per token against a device's peak and bandwidth.

A step cannot take less than max(FLOPs / peak FLOP/s, bytes / bandwidth) per token, so
tokens/s <= 1 / that. The bench prints this bound for the machine it ran on (matmul peak and
memory bandwidth both measured in the same run) and for accelerators named with
`--device_spec`, from the vendors' public data sheets (below; never measured here). The bytes
come from the model's analytic byte count (`accounting.bytes_per_token`), which assumes no
reuse through caches: on a CPU whose caches hold the weights, the achieved fraction can exceed 1.

Latency: the fused window runs each token's cell as a chain of small operations, one after
another for the whole batch (`loop_ops` reads how many off the compiled step: the innermost
while loops' bodies). Each takes at least `OP_LATENCY_S` of its platform (stated and sourced
below), so a step of T tokens for B sequences takes at least T x ops x latency, i.e.
ops x latency / B per token: a third floor next to FLOPs / peak and bytes / bandwidth, and the
one that binds at small per-device batches.
"""

import re
from typing import NamedTuple


class DeviceSpec(NamedTuple):
    name: str
    peak_flops: float  # dense bfloat16 matmul FLOP/s per chip
    bandwidth: float  # HBM bytes/s per chip
    source: str
    platform: str = "gpu"  # its per-operation latency: OP_LATENCY_S


# Vendors' public data-sheet numbers, dense (no 2:4 sparsity) bfloat16, one chip:
DEVICE_SPECS = {
    # NVIDIA H100 Tensor Core GPU data sheet, SXM column: BF16 Tensor Core 1,979 TFLOPS "with
    # sparsity" (989 dense), GPU memory bandwidth 3.35 TB/s.
    "h100": DeviceSpec("H100 SXM", 989e12, 3.35e12, "NVIDIA H100 data sheet (SXM)"),
    # NVIDIA H200 Tensor Core GPU data sheet, SXM column: BF16 1,979 TFLOPS with sparsity
    # (989 dense), 4.8 TB/s HBM3e.
    "h200": DeviceSpec("H200 SXM", 989e12, 4.8e12, "NVIDIA H200 data sheet (SXM)"),
    # Google Cloud TPU v5e documentation (cloud.google.com/tpu/docs/v5e), key chip
    # specifications: 197 TFLOPs bf16, HBM2 16 GB at 819 GBps.
    "v5e": DeviceSpec("TPU v5e", 197e12, 819e9, "cloud.google.com/tpu/docs/v5e", "tpu"),
    # Google Cloud TPU v5p documentation (cloud.google.com/tpu/docs/v5p), key chip
    # specifications: 459 TFLOPs bf16, HBM 95 GB at 2,765 GBps.
    "v5p": DeviceSpec("TPU v5p", 459e12, 2765e9, "cloud.google.com/tpu/docs/v5p", "tpu"),
}


def parse_device_specs(csv: str) -> list[DeviceSpec]:
    """`h100,v5e` -> their specs; an unknown name raises a one-line ValueError."""
    names = [n.strip().lower() for n in csv.split(",") if n.strip()]
    unknown = [n for n in names if n not in DEVICE_SPECS]
    if unknown:
        raise ValueError(f"unknown --device_spec {unknown}; choose from {sorted(DEVICE_SPECS)}")
    return [DEVICE_SPECS[n] for n in names]


# Per-operation latency: the least time one operation of a per-token loop body takes however
# little it moves, since the body's operations run one after another, token after token.
OP_LATENCY_S = {
    # NVIDIA Technical Blog, "Getting Started with CUDA Graphs": short kernels launched back to
    # back cost a few microseconds each (launch overhead included); XLA:GPU launches each
    # fusion and custom call of a while body as its own kernel.
    "gpu": 4e-6,
    # No published per-operation figure for a TPU program's sequential operations was found:
    # an assumption (operations run from one compiled program, no host launch), to be replaced
    # by a measurement.
    "tpu": 1e-6,
}


def bound(
    flops_per_token: float,
    bytes_per_token: float,
    peak_flops: float,
    bandwidth: float,
    sequential_ops_per_token: float = 0.0,
    op_latency_s: float = 0.0,
):
    """(tokens/s bound, 'compute' | 'memory' | 'latency'): the roofline of one token's FLOPs
    and bytes, and the latency floor of its sequential operations. `sequential_ops_per_token`:
    the operations a time step runs one after another for the whole batch, divided by the
    batch (a step of T tokens for B sequences runs T x ops operations in sequence), so each
    costs `op_latency_s` at least; 0 leaves the plain roofline."""
    times = {
        "compute": flops_per_token / peak_flops,
        "memory": bytes_per_token / bandwidth,
        "latency": sequential_ops_per_token * op_latency_s,
    }
    which = max(times, key=times.get)
    return 1.0 / times[which], which


def loop_ops(hlo_text: str, seq_len: int) -> dict:
    """Operations per token in the per-token loop bodies of a compiled step's optimised HLO:
    the innermost while loops (whose bodies run no loop), each body's operations (every
    instruction with an array result but shape plumbing and control flow: on a GPU each is a
    kernel launch; scalar bookkeeping left out; fusions and custom calls counted apart) times
    the times the body runs (its trip count times those of the loops around it), over
    `seq_len`. Backward loops are those whose JAX op_name holds `transpose` (the vjp); forward
    the others. Unknown trip counts count once."""
    from gpn_jax.parallel import hlo

    comps, entry = hlo.parse(hlo_text)
    loops, totals = [], {"forward": 0.0, "backward": 0.0}
    for body, direction, times, ops in _per_token_ops(comps, entry):
        loops.append(
            {
                "body": body,
                "direction": direction,
                "runs": times,
                "ops": len(ops),
                "fusions": sum(i.opcode == "fusion" for i in ops),
                "custom_calls": sum(i.opcode == "custom-call" for i in ops),
            }
        )
        totals[direction] += len(ops) * times / seq_len
    return {
        "loops": loops,
        "forward_ops_per_token": totals["forward"],
        "backward_ops_per_token": totals["backward"],
        "ops_per_token": totals["forward"] + totals["backward"],
    }


# What each operation of a per-token loop body is (`loop_kinds`), in the order tables list them.
KINDS = ("weight products", "memory passes", "per-step stores", "elementwise and reductions")


def loop_kinds(hlo_text: str, seq_len: int, batch: int, elements: int) -> dict:
    """The per-token loops' operations (`loop_ops`' count) by kind (`KINDS`): per kind its
    operations per token step and the HBM bytes they move per token (`traffic.op_bytes`; a
    step runs `batch` sequences; `elements`: the memory's per-device size, whose stacks the
    memory's kernels index one step of). Weight products are matrix products by a weight,
    memory passes the kernels' custom calls (`_kind`), per-step stores the in-place writes of
    a step's values into the loop's stacked outputs."""
    from gpn_jax.benchmarks import traffic
    from gpn_jax.parallel import hlo

    comps, entry = hlo.parse(hlo_text)
    out = {k: {"ops": 0.0, "bytes_per_token": 0.0} for k in KINDS}
    for body, _, times, ops in _per_token_ops(comps, entry):
        shapes = {i.name: i.result for i in comps[body]}
        for ins in ops:
            kind = out[_kind(ins, comps)]
            kind["ops"] += times / seq_len
            moved = traffic.op_bytes(ins, comps, elements, shapes)
            kind["bytes_per_token"] += moved * times / (seq_len * batch)
    return out


def _per_token_ops(comps: dict, entry: str | None):
    """(body, 'forward' | 'backward', times it runs, its launched operations) of each
    innermost while loop: an outer loop (per segment) runs no operation per token itself."""
    for (body, direction), times in _body_runs(comps, entry).items():
        instrs = comps.get(body, [])
        if not any(i.opcode == "while" for i in instrs):
            yield body, direction, times, [i for i in instrs if _launched(i)]


def _kind(ins, comps: dict) -> str:
    """`KINDS` of one loop-body operation: a fusion computing a matrix product by a weight
    (a `dot` without batch dimensions or a `convolution` without groups, as XLA:TPU writes
    it; XLA:GPU's matmul fusions, which may split the contraction into a batch) or a cuBLAS
    call is a weight product; another custom call (a Pallas kernel) or a fusion of batched
    products (the memory's per-head products on the XLA formulas) a memory pass."""
    callee = re.search(r"calls=%?([\w.\-]+)", ins.attrs)
    name = callee.group(1) if callee else ""
    if ins.opcode == "custom-call":
        return KINDS[0] if "cublas" in ins.attrs else KINDS[1]
    if ins.opcode.startswith("async-") or ins.opcode.endswith(("-start", "-done")):
        return KINDS[2] if "dynamic_update_slice" in ins.attrs else KINDS[3]
    body = comps.get(name, [])
    products = [i for i in body if i.opcode in ("dot", "convolution")]
    if ins.opcode == "fusion" and ("gemm" in name or any(map(_plain_product, products))):
        return KINDS[0]
    if products:
        return KINDS[1]
    inner = {i.name: i for i in body}
    roots = [i for i in body if i.root]
    outs = roots[0].operands.split(",") if roots and roots[0].opcode == "tuple" else []
    stored = [inner.get(o.strip().split()[-1].lstrip("%")) for o in outs] + roots
    if any(i is not None and i.opcode == "dynamic-update-slice" for i in stored):
        return KINDS[2]
    return KINDS[3]


def _launched(ins) -> bool:
    """Whether a loop-body instruction is an operation `loop_ops` counts: an array result, no
    shape plumbing or control flow, not the loop's scalar bookkeeping."""
    from gpn_jax.benchmarks import traffic

    plumbing = ins.opcode in traffic.FREE or ins.opcode in traffic.CONTROL
    return not plumbing and not _scalar(ins.result)


def _plain_product(ins) -> bool:
    """A matrix product without batch dimensions or groups."""
    return "lhs_batch_dims" not in ins.attrs and "group_count" not in ins.attrs


def _scalar(shape_text: str) -> bool:
    """Whether a result holds only scalars (a loop counter, a flag): no array operation."""
    from gpn_jax.benchmarks import traffic

    return all(not dims for _, dims, _ in traffic.SHAPE.findall(shape_text))


def _body_runs(comps: dict, entry: str | None) -> dict:
    """{(while body, 'forward' | 'backward'): times it runs in one execution of `entry`}."""
    import re

    from gpn_jax.benchmarks import traffic
    from gpn_jax.parallel import hlo

    out: dict = {}

    def walk(name: str, times: int, backward: bool, seen: tuple) -> None:
        if name in seen or name not in comps:
            return
        for ins in comps[name]:
            callees = re.findall(r"(?:calls|to_apply)=%?([\w.\-]+)", ins.attrs)
            if ins.opcode == "while":
                parts = hlo.while_parts(ins)
                if not parts:
                    continue
                cond, body = parts
                trips = traffic.trip_count(ins, comps, cond) or 1
                back = backward or "transpose" in ins.attrs
                key = (body, "backward" if back else "forward")
                out[key] = out.get(key, 0) + times * trips
                walk(body, times * trips, back, seen + (name,))
            elif ins.opcode in ("call", "conditional"):
                for c in callees:
                    walk(c, times, backward, seen + (name,))

    if entry:
        walk(entry, 1, False, ())
    return out


def _fmt_bytes(b: float) -> str:
    return f"{b / 2**20:.2f} MiB" if b >= 2**20 else f"{b / 2**10:.1f} KiB"


def _terms(byt: dict) -> str:
    return ", ".join(f"{k} {_fmt_bytes(v)}" for k, v in byt.items() if k != "train")


def table(records: list[dict], peak_flops: float, bandwidth: float, specs=()) -> str:
    """Markdown: per training record the FLOPs and bytes per token, the bound on this machine
    and the achieved fraction of it, then the bound on each listed accelerator (bfloat16
    byte counts, `bytes_per_token_bf16`)."""
    rows = [r for r in records if r.get("suite") == "train" and r.get("bytes_per_token")]
    if not rows:
        return ""
    out = [
        "| model | FLOPs/token | bytes/token | FLOP/byte | device | bound tokens/s | bound by "
        "| achieved |",
        "|---|---:|---:|---:|---|---:|---|---:|",
    ]
    for r in rows:
        flops, byt = r["flops_per_token"], r["bytes_per_token"]["train"]
        tps, by = bound(flops, byt, peak_flops, bandwidth)
        name = r["model"]
        out.append(
            f"| {name} | {flops / 1e6:.1f}M | {_fmt_bytes(byt)} | {flops / byt:.1f} "
            f"| this machine | {tps:,.0f} | {by} | {r['tokens_per_s'] / tps:.2f} |"
        )
        for s in specs:
            byt16 = r["bytes_per_token_bf16"]["train"]
            seq_ops = (r.get("ops_per_token") or 0.0) / (r.get("batch_size") or 1)  # see top
            tps16, by16 = bound(
                flops, byt16, s.peak_flops, s.bandwidth, seq_ops, OP_LATENCY_S[s.platform]
            )
            out.append(
                f"| {name} | {flops / 1e6:.1f}M | {_fmt_bytes(byt16)} | {flops / byt16:.1f} "
                f"| {s.name} (data sheet, bf16) | {tps16:,.0f} | {by16} | unmeasured |"
            )
    return "\n".join(out)


def byte_lines(records: list[dict]) -> list[str]:
    """Each training record's bytes per token by term, and what `memory_dtype=bfloat16` saves."""
    lines = []
    for r in records:
        byt = r.get("bytes_per_token")
        if r.get("suite") != "train" or not byt:
            continue
        line = f"{r['model']} bytes/token: {_terms(byt)}"
        saved = r.get("memory_bf16_saves")
        if saved:
            line += f"; memory_dtype=bfloat16 saves {_fmt_bytes(saved)}/token"
            line += f" ({100 * saved / byt['train']:.0f} %)"
        lines.append(line)
    return lines


def floors(compiled: dict, analytic: dict, bandwidth: float, batch: int) -> list[tuple]:
    """The floors per token, in µs, of a compiled step's parts that bytes and launches set:
    (part, µs) for the memory matrix's traffic as compiled and the rest of the analytic bytes,
    both at `bandwidth` (bytes/s), and the per-token loops' operations at the GPU's latency.
    `compiled`: `gpn_jax.aot`'s record (memory_bytes_per_token_hlo, ops_per_token);
    `analytic`: the roofline's bytes (bytes_per_token, memory_bytes); `batch`: sequences."""
    return [
        ("the memory matrix's HBM traffic, as compiled", compiled["memory_bytes_per_token_hlo"]
         / bandwidth * 1e6),
        ("weights, activations and logits (analytic bytes)",
         (analytic["bytes_per_token"] - analytic["memory_bytes"]) / bandwidth * 1e6),
        (f"per-token loop operations ({compiled['ops_per_token']:.1f} × "
         f"{OP_LATENCY_S['gpu'] * 1e6:.0f} µs / B)",
         compiled["ops_per_token"] * OP_LATENCY_S["gpu"] / batch * 1e6),
    ]  # fmt: skip


def time_split(run: dict, compiled: dict, analytic: dict, bandwidth: float) -> list[dict]:
    """Where a measured step's time per token goes: the floors of its parts, added (the fused
    window runs each token's kernels one after another, so they do not overlap), and what they
    leave unexplained. `run`: the measured record (tokens_per_s, mfu_pct, batch_size);
    `compiled`, `analytic`, `bandwidth`: as `floors` (the run's measured copy bandwidth).
    Rows: part, µs per token, share."""
    measured = 1e6 / run["tokens_per_s"]
    parts = floors(compiled, analytic, bandwidth, run["batch_size"])
    parts.append(
        ("matrix FLOPs at the data-sheet peak (MFU × step)", run["mfu_pct"] / 100 * measured)
    )
    parts.append(("not accounted for", measured - sum(us for _, us in parts)))
    rows = [{"part": p, "us_per_token": us, "share": us / measured} for p, us in parts]
    return rows + [{"part": "measured step", "us_per_token": measured, "share": 1.0}]
