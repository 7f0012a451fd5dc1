"""Tables, the scaling analysis and the scaling plot of a benchmark run."""

import math

from gpn_jax.models import factory

# GPN+M under each of its scans (the bench runs both); every other model under its label
SCANS = {"gpn_m": "GPN+M (fused)", "gpn_m_autodiff": "GPN+M (autodiff)"}


def _gib(b) -> str:
    return "-" if b is None else f"{b / 2**30:.2f} GiB"


def model_label(model: str) -> str:
    return SCANS.get(model) or factory.label(model)


def _name(r) -> str:
    return model_label(r["model"])


def train_table(records: list[dict]) -> str:
    """Markdown table of the training-step records, with each model's throughput relative to the first."""
    rows = [r for r in records if r.get("suite") == "train"]
    if not rows:
        return ""
    ref = next((r for r in rows if r["model"] == "transformer"), rows[0])
    out = [
        "| model | params | B x T | step (median) | tokens/s | vs "
        + _name(ref)
        + " | FLOPs/token (train) | achieved | MFU | peak mem |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {_name(r)} | {r['params'] / 1e6:.2f}M | {r['batch_size']} x {r['seq_len']} "
            f"| {r['step_time_s']:.3f} s | {r['tokens_per_s']:,.0f} "
            f"| {r['tokens_per_s'] / ref['tokens_per_s']:.2f}x "
            f"| {r['flops_per_token'] / 1e6:.1f}M | {r['achieved_flops'] / 1e9:.1f} GFLOP/s "
            f"| {100 * r['mfu']:.1f} % | {_gib(r['peak_mem_bytes'])} |"
        )
    return "\n".join(out)


def alternate_table(records: list[dict]) -> str:
    """Markdown table of the `alternate` suite: step times of rounds run side by side in time and
    the median per-round ratio against the reference."""
    rows = [r for r in records if r.get("suite") == "alternate"]
    if not rows:
        return ""
    ref = model_label(rows[0]["reference"])
    out = [
        f"| model | B x T | rounds | step (median) | tokens/s | vs {ref} (median of rounds) | MFU |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {_name(r)} | {r['batch_size']} x {r['seq_len']} | {r['rounds']} "
            f"| {r['step_time_s']:.3f} s | {r['tokens_per_s']:,.0f} | {r['vs_reference']:.2f}x "
            f"| {100 * r['mfu']:.1f} % |"
        )
    return "\n".join(out)


def scaling_table(records: list[dict]) -> str:
    rows = [r for r in records if r.get("suite") == "scaling"]
    if not rows:
        return ""
    out = [
        "| model | B | T | remat segment | step (median) | tokens/s | MFU | peak mem |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: (r["batch_size"], r["seq_len"], r["remat_segment"] or 0)):
        out.append(
            f"| {_name(r)} | {r['batch_size']} | {r['seq_len']} | {r['remat_segment'] or 'off'} "
            f"| {r['step_time_s']:.3f} s | {r['tokens_per_s']:,.0f} | {100 * r['mfu']:.1f} % "
            f"| {_gib(r['peak_mem_bytes'])} |"
        )
    return "\n".join(out)


def generate_table(records: list[dict]) -> str:
    rows = [r for r in records if r.get("suite") == "generate"]
    if not rows:
        return ""
    out = [
        "| model | batch | context | latency / token | tokens/s | state | note |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if r.get("skipped"):
            out.append(
                f"| {_name(r)} | {r['batch_size']} | {r['context']:,} | - | - "
                f"| {_gib(r['state_bytes'])} | not run: {r['skipped']} |"
            )
            continue
        out.append(
            f"| {_name(r)} | {r['batch_size']} | {r['context']:,} | {1e3 * r['latency_s']:.2f} ms "
            f"| {r['tokens_per_s']:,.1f} | {r['state_bytes'] / 2**20:.2f} MiB | {r.get('note', '')} |"
        )
    return "\n".join(out)


def memory_slopes(
    records: list[dict], remat: bool, batch_size: int
) -> list[tuple[int, int, float]]:
    """Log-log slopes of the model's memory (peak minus the process baseline) between successive T.

    A slope <= 1 means memory grows no worse than linearly in T.
    """
    rows = sorted(
        (
            r
            for r in records
            if r.get("suite") == "scaling"
            and r["batch_size"] == batch_size
            and bool(r["remat_segment"]) == remat
        ),
        key=lambda r: r["seq_len"],
    )
    out = []
    for a, b in zip(rows, rows[1:], strict=False):
        ma = a["peak_mem_bytes"] - a.get("baseline_rss_bytes", 0)
        mb = b["peak_mem_bytes"] - b.get("baseline_rss_bytes", 0)
        if ma > 0 and mb > 0 and b["seq_len"] > a["seq_len"]:
            out.append(
                (
                    a["seq_len"],
                    b["seq_len"],
                    math.log(mb / ma) / math.log(b["seq_len"] / a["seq_len"]),
                )
            )
    return out


def generate_checks(records: list[dict]) -> list[str]:
    """Latency at the longest context relative to the shortest, per (model, batch)."""
    lines = []
    groups: dict = {}
    for r in records:
        if r.get("suite") == "generate" and not r.get("skipped"):
            groups.setdefault((r["model"], r["batch_size"]), []).append(r)
    for (model, b), rows in groups.items():
        rows.sort(key=lambda r: r["context"])
        lo, hi = rows[0], rows[-1]
        ratio = hi["latency_s"] / lo["latency_s"]
        lines.append(
            f"{model_label(model)} batch {b}: latency at {hi['context']:,} = "
            f"{ratio:.3f} x latency at {lo['context']:,}"
        )
    return lines


def plot_scaling(records: list[dict], path: str) -> bool:
    """Step time and peak memory vs T and vs B, remat off / on. Returns False without data."""
    rows = [r for r in records if r.get("suite") == "scaling"]
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    sweeps = (
        ("seq_len", "batch_size", "T (tokens per window)"),
        ("batch_size", "seq_len", "B (sequences)"),
    )
    for row, (x, fixed, label) in enumerate(sweeps):
        xs = sorted({r[x] for r in rows})
        fixed_value = _sweep_fixed(rows, x, fixed)
        for remat in (False, True):
            pts = sorted(
                (r for r in rows if r[fixed] == fixed_value and bool(r["remat_segment"]) == remat),
                key=lambda r: r[x],
            )
            pts = [r for r in pts if r[x] in xs]
            if not pts:
                continue
            lab = "remat (segment ~sqrt(T))" if remat else "no remat"
            px = [r[x] for r in pts]
            for col, y in enumerate(
                ([r["step_time_s"] for r in pts], [r["peak_mem_bytes"] / 2**30 for r in pts])
            ):
                axes[row][col].plot(px, y, "o-", label=lab)
                if not remat and len(px) > 1:  # linear-growth reference through the first point
                    ref = [y[0] * v / px[0] for v in px]
                    axes[row][col].plot(px, ref, "--", color="gray", lw=1, label=f"∝ {label[0]}")
        for col, ylab in enumerate(("step time (s)", "peak memory (GiB)")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel(f"{label}, {fixed} = {fixed_value}")
            ax.set_ylabel(ylab)
            ax.grid(True, alpha=0.3)
            ax.legend()
    model = model_label(rows[0]["model"])
    fig.suptitle(f"{model} training step scaling ({rows[0].get('machine', '')})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _sweep_fixed(rows, x, fixed):
    """The value of `fixed` shared by the most points of the sweep over `x`."""
    counts: dict = {}
    for r in rows:
        counts.setdefault(r[fixed], set()).add(r[x])
    return max(counts, key=lambda v: len(counts[v]))
