"""The roofline of a training step: FLOPs and bytes per token against a device's peak and bandwidth.

A step cannot take less than max(FLOPs / peak FLOP/s, bytes / bandwidth) per token, so
tokens/s <= 1 / that. The bench prints this bound for the machine it ran on (matmul peak and
memory bandwidth both measured in the same run) and for accelerators named with
`--device_spec`, from the vendors' public data sheets (below; never measured here). The bytes
come from the model's analytic byte count (`accounting.bytes_per_token`), which assumes no
reuse through caches: on a CPU whose caches hold the weights, the achieved fraction can exceed 1.
"""

from typing import NamedTuple


class DeviceSpec(NamedTuple):
    name: str
    peak_flops: float  # dense bfloat16 matmul FLOP/s per chip
    bandwidth: float  # HBM bytes/s per chip
    source: str


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
    "v5e": DeviceSpec("TPU v5e", 197e12, 819e9, "cloud.google.com/tpu/docs/v5e"),
    # Google Cloud TPU v5p documentation (cloud.google.com/tpu/docs/v5p), key chip
    # specifications: 459 TFLOPs bf16, HBM 95 GB at 2,765 GBps.
    "v5p": DeviceSpec("TPU v5p", 459e12, 2765e9, "cloud.google.com/tpu/docs/v5p"),
}


def parse_device_specs(csv: str) -> list[DeviceSpec]:
    """`h100,v5e` -> their specs; an unknown name raises a one-line ValueError."""
    names = [n.strip().lower() for n in csv.split(",") if n.strip()]
    unknown = [n for n in names if n not in DEVICE_SPECS]
    if unknown:
        raise ValueError(f"unknown --device_spec {unknown}; choose from {sorted(DEVICE_SPECS)}")
    return [DEVICE_SPECS[n] for n in names]


def bound(flops_per_token: float, bytes_per_token: float, peak_flops: float, bandwidth: float):
    """(tokens/s bound, 'compute' | 'memory'): the roofline of one token's FLOPs and bytes."""
    t_compute = flops_per_token / peak_flops
    t_memory = bytes_per_token / bandwidth
    return 1.0 / max(t_compute, t_memory), ("compute" if t_compute >= t_memory else "memory")


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
            tps16, by16 = bound(flops, byt16, s.peak_flops, s.bandwidth)
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
