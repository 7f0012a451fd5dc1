"""Expected chip-hours of the paper's 130M runs, from the roofline: an estimate, a lower bound.

    python launch/chip_hours.py --out experiments/results/chip_hours_130m.json

A run is `steps x batch_size x seq_len` tokens (10,000 x 128 x 2,048 in the paper's recipe); a
chip cannot train faster than the roofline's tokens/s (`gpn_jax.benchmarks.roofline`: bytes
and FLOPs per token against the data sheet's bandwidth and peak, the numbers
`python -m gpn_jax.summary --device_spec=... --json` prints), so tokens / bound is the fewest
chip-seconds a run can take. Real runs take longer (the bound assumes every byte moves once at
full bandwidth).

Only what runs is listed: a per-chip batch above the largest one GPN+M's train step compiled
within a TPU's memory (the `gpn_jax.aot` records experiments/results/aot_130m_*.json, README
"Check the step fits") has no chip-hours on that TPU ("—"), and for each accelerator the record
names the cheapest per-chip batch that fits (`recommended`; GPUs have no compile record, so
none is recommended there: run `gpn_jax.aot` on one first).
"""

import argparse
import datetime
import glob
import json
import os
import platform
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICES = {"h100": "H100 SXM", "h200": "H200 SXM", "v5e": "TPU v5e", "v5p": "TPU v5p"}
KINDS = {"TPU v5 lite": "v5e", "TPU v5": "v5p"}  # gpn_jax.aot's device_kind -> DEVICES key
MODELS = {
    "GPN+M (1L)": "gpn_m_1l_130m",
    "Gated DeltaNet": "gdn_130m",
    "Transformer++": "transformer_130m",
}
# Per-chip batches of the recipe's global 128: a v5p-16's share (8 chips), v5e's largest that
# fits (4 chips), all on one chip. Fewer chips at the same global batch move fewer weight bytes
# per token: the larger the per-chip batch that fits, the fewer chip-hours.
BATCHES = (16, 32, 128)


def largest_fitting(pattern: str = "experiments/results/aot_130m_*.json") -> dict:
    """{device: the largest per-chip batch GPN+M's step compiled within its memory} (TPUs)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(ROOT, pattern))):
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        device = KINDS.get(record.get("device_kind"))
        if device and record.get("fits") and record.get("memory_dtype") == "float32":
            out[device] = max(out.get(device, 0), int(record["batch_per_device"]))
    return out


def bounds(config_name: str, batch: int) -> tuple[int, dict, str]:
    """(tokens per run, {device: roofline tokens/s per chip}, what bounds it on v5e)."""
    sys.path.insert(0, ROOT)
    from gpn_jax.benchmarks import roofline
    from gpn_jax.models import accounting, factory

    module = __import__(f"gpn_jax.configs.{config_name}", fromlist=["get_config"])
    config = module.get_config()
    t = config.train
    model = factory.build_model(config.model)
    flops = accounting.summary(model, t.seq_len)["flops_per_token"]["train"]
    byt = accounting.bytes_per_token(model, batch, t.seq_len)["train"]
    specs = {d.name: d for d in roofline.parse_device_specs(",".join(DEVICES))}
    rates, bound_by = {}, ""
    for key, name in DEVICES.items():
        tps, by = roofline.bound(flops, byt, specs[name].peak_flops, specs[name].bandwidth)
        rates[key] = tps
        bound_by = by if key == "v5e" else bound_by
    return int(t.steps * t.batch_size * t.seq_len), rates, bound_by


def row(model: str, batch: int, fits: dict) -> dict:
    tokens, rates, bound_by = bounds(MODELS[model], batch)
    hours = {
        f"{k}_chip_hours": tokens / rates[k] / 3600 if batch <= fits.get(k, batch) else None
        for k in DEVICES
    }
    return {"model": model, "batch_per_chip": batch, "tokens_per_run": tokens,
            "bound_by": bound_by, **hours}  # fmt: skip


def recommended(rows: list[dict], fits: dict) -> list[dict]:
    """Per accelerator with a compile record: the GPN+M row that fits and costs least."""
    out = []
    for k in DEVICES:
        runnable = [r for r in rows if r["model"] == "GPN+M (1L)" and r[f"{k}_chip_hours"]]
        if k in fits and runnable:
            best = min(runnable, key=lambda r: r[f"{k}_chip_hours"])
            out.append({"device": k, "batch_per_chip": best["batch_per_chip"],
                        "chip_hours": best[f"{k}_chip_hours"],
                        "largest_fitting": fits[k]})  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    fits = largest_fitting()
    rows = [row(model, batch, fits) for model in MODELS for batch in BATCHES]
    record = {
        "command": "python launch/chip_hours.py --out " + args.out,
        "date": datetime.date.today().isoformat(),
        "machine": f"analytic (gpn_jax roofline, aot_130m_*.json fits); on {platform.machine()}",
        "version": "gpn_jax 0.1.0",
        "estimate": "lower bound: run tokens / the roofline's tokens/s per chip",
        "largest_fitting": fits,
        "recommended": recommended(rows, fits),
        "rows": rows,
    }
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    for r in record["recommended"]:
        print(f"{r['device']}: {r['batch_per_chip']} sequences per chip, "
              f">= {r['chip_hours']:.1f} chip-hours (largest that fits: {r['largest_fitting']})")  # fmt: skip


if __name__ == "__main__":
    main()
