"""Expected chip-hours of the paper's 130M runs, from the roofline: an estimate, a lower bound.

    python launch/chip_hours.py --out experiments/results/chip_hours_130m.json

A run is `steps x batch_size x seq_len` tokens (10,000 x 128 x 2,048 in the paper's recipe); a
chip cannot train faster than the roofline's tokens/s (`gpn_jax.benchmarks.roofline`: bytes
and FLOPs per token against the data sheet's bandwidth and peak), so tokens / bound is the
fewest chip-seconds a run can take. GPN+M's bounds are those of
experiments/results/roofline_130m.json (its float32 memory rows, the paper's recipe); the
baselines' come from the same model, `python -m gpn_jax.summary --device_spec=... --json`.
Real runs take longer (the bound assumes every byte moves once at full bandwidth).
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICES = {"h100": "H100 SXM", "h200": "H200 SXM", "v5e": "TPU v5e", "v5p": "TPU v5p"}
BASELINES = {"Gated DeltaNet": "gdn_130m", "Transformer++": "transformer_130m"}
BATCHES = (16, 128)


def run_tokens(config_name: str) -> int:
    sys.path.insert(0, ROOT)
    module = __import__(f"experiments.configs.{config_name}", fromlist=["get_config"])
    t = module.get_config().train
    return int(t.steps * t.batch_size * t.seq_len)


def summary_bounds(config_name: str, batch: int) -> tuple[dict, str]:
    cmd = [sys.executable, "-m", "gpn_jax.summary", f"--config=experiments/configs/{config_name}.py",
           "--device_spec=" + ",".join(DEVICES), f"--batch_size={batch}", "--json"]  # fmt: skip
    out = json.loads(
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    )
    roof = out["roofline"]
    bounds = {k: roof[name]["tokens_per_s"] for k, name in DEVICES.items()}
    return bounds, roof[DEVICES["v5e"]]["bound_by"]


def row(model: str, batch: int, tokens: int, bounds: dict, bound_by: str) -> dict:
    hours = {f"{k}_chip_hours": tokens / bounds[k] / 3600 for k in DEVICES}
    return {"model": model, "batch_per_chip": batch, "tokens_per_run": tokens,
            "bound_by": bound_by, **hours}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rows = []
    roofline = json.load(open(os.path.join(ROOT, "experiments/results/roofline_130m.json")))
    tokens = run_tokens("gpn_m_1l_130m")
    for r in roofline["rows"]:
        if r["memory_dtype"] == "float32" and r["batch_per_chip"] in BATCHES:
            bound_by = "+".join(r["bound_by"])
            rows.append(row("GPN+M (1L)", r["batch_per_chip"], tokens, r, bound_by))
    for model, name in BASELINES.items():
        for batch in BATCHES:
            rows.append(row(model, batch, run_tokens(name), *summary_bounds(name, batch)))
    record = {
        "command": "python launch/chip_hours.py --out " + args.out,
        "date": datetime.date.today().isoformat(),
        "machine": f"analytic (roofline_130m.json, gpn_jax.summary); computed on {platform.machine()}",
        "version": "gpn_jax 0.1.0",
        "estimate": "lower bound: run tokens / the roofline's tokens/s per chip",
        "rows": rows,
    }
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
