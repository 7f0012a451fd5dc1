"""The prepared accelerator run (`experiments/accel_bench.py`): the memory's passes XLA
against Pallas, the 130M training step with each kernel choice, JSON and HLO in one folder.

Every part runs under the time left of one budget and writes `accel.json` when it ends, so a
run cut off by its caller still leaves what it measured. Part (a) needs
`gpn_jax.kernels.pallas.bench.time_passes(B, H, K, U, memory_dtype, backend)` (seconds per
time step of the batch: every pass of the forward and backward over the memory); without it
the part is skipped with the reason. Its GB/s is the schedule's minimum bytes
(`traffic.min_bytes_per_cell`) over the measured time, against the copy bandwidth measured in
the same run (`common.memory_bandwidth`). Part (b) runs the bench's train suite
(`benchmarks.runner`) at one batch for each `model.kernels` choice, each record in its own
process with a timeout, with `--profile`'s optimised HLO (`profile/<model>/train_step.hlo.txt`).
"""

import json
import os
import time

from gpn_jax.benchmarks import traffic, workdirs


def _save(out_dir: str, result: dict) -> None:
    with workdirs.open_new(os.path.join(out_dir, "accel.json")) as f:
        json.dump(result, f, indent=1)


def passes_part(model_cfg, batch: int, backends=("xla", "pallas")) -> dict:
    """Part (a): seconds per step of the memory's passes per backend and storage dtype."""
    try:
        from gpn_jax.kernels.pallas import bench as pallas_bench
    except ImportError as e:
        return {"skipped": f"gpn_jax.kernels.pallas.bench is missing ({e})"}
    from gpn_jax.benchmarks import common

    H, K, U = (int(model_cfg[k]) for k in ("n_heads", "d_key", "d_value"))
    copy_bw = common.memory_bandwidth()
    rows = []
    for dtype in ("float32", "bfloat16"):
        for backend in backends:
            row = {"memory_dtype": dtype, "backend": backend}
            try:
                s = float(pallas_bench.time_passes(batch, H, K, U, dtype, backend))
            except Exception as e:  # noqa: BLE001 - one failed backend must not lose the others
                rows.append(row | {"error": str(e).strip().splitlines()[0][:300]})
                continue
            moved = batch * H * K * U * traffic.min_bytes_per_cell(dtype)
            rows.append(
                row
                | {
                    "seconds_per_step": s,
                    "us_per_token": 1e6 * s / batch,
                    "gb_per_s": moved / s / 1e9,
                    "fraction_of_copy_bandwidth": moved / s / copy_bw,
                }
            )
    return {"batch": batch, "copy_bandwidth_gb_per_s": copy_bw / 1e9, "rows": rows}


def step_part(config, out_dir: str, choices, deadline: float) -> list[dict]:
    """Part (b): the train suite once per `model.kernels` choice, within `deadline`."""
    from gpn_jax.benchmarks import runner

    records = []
    name = config.train.models
    for choice in choices:
        left = deadline - time.monotonic()
        if left < 60:
            records.append({"kernels": choice, "skipped": "out of time"})
            continue
        c = config.copy_and_resolve_references()
        c.models[name].kernels = choice
        c.train.timeout_s = int(left)
        workdir = os.path.join(out_dir, f"step_{choice}")
        for r in runner.run(c, workdir, "", ["train"], True, True):
            records.append(r | {"kernels": choice})
    return records


def run(config, out_dir: str, budget_s: float, parts) -> dict:
    """Runs `parts` ('passes', 'step') of the accelerator run into `out_dir`."""
    deadline = time.monotonic() + budget_s
    out_dir = workdirs.prepare(out_dir, "accel_bench")
    result = {"config": config.name, "batch": int(config.train.batch_size)}
    model_cfg = config.models[config.train.models]
    if "passes" in parts:
        result["passes"] = passes_part(model_cfg, int(config.train.batch_size))
        _save(out_dir, result)
    if "step" in parts:
        result["step"] = step_part(config, out_dir, ("xla", "pallas"), deadline)
        _save(out_dir, result)
    return result
