"""The prepared accelerator run (`experiments/bench/accel_bench.py`): the memory's passes XLA
against Pallas, the 130M training step with each kernel choice, JSON and HLO in one folder.

Every part runs under the time left of one budget and writes `accel.json` when it ends, so a
run cut off by its caller still leaves what it measured. Part (a) times
each of the memory's four passes with `gpn_jax.kernels.pallas.bench.time_passes`; its GB/s is
the pass's minimum bytes per token over the measured time, against the copy bandwidth measured
in the same run (`measure.memory_bandwidth`). Part (b) runs the bench's train suite
(`benchmarks.orchestrate`) at one batch for each `model.kernels` choice, each record in its own
process with a timeout, with `--profile`'s optimised HLO (`profile/<model>/train_step.hlo.txt`).
"""

import json
import os
import time

from gpn_jax.benchmarks import workdirs


def _save(out_dir: str, result: dict) -> None:
    with workdirs.open_new(os.path.join(out_dir, "accel.json")) as f:
        json.dump(result, f, indent=1)


def passes_part(model_cfg, batch: int) -> dict:
    """Part (a): microseconds per token of each of the memory's passes, XLA against Pallas, per
    storage dtype, and the GB/s of its minimum bytes against the copy bandwidth."""
    try:
        from gpn_jax.kernels.pallas import bench as pallas_bench
    except ImportError as e:
        return {"skipped": f"gpn_jax.kernels.pallas.bench cannot be imported ({e})"}
    from gpn_jax.benchmarks import measure

    H, K, U = (int(model_cfg[k]) for k in ("n_heads", "d_key", "d_value"))
    copy_bw = measure.memory_bandwidth()
    rows = []
    for dtype in ("float32", "bfloat16"):
        try:
            timed = pallas_bench.time_passes(batch, H, K, U, dtype)
        except Exception as e:  # noqa: BLE001 - one failed dtype must not lose the other
            rows.append({"memory_dtype": dtype, "error": str(e).strip().splitlines()[0][:300]})
            continue
        rows += [
            _pass_row(dtype, name, backend, r, copy_bw)
            for name, r in timed.items()
            for backend in ("xla", "pallas")
        ]
    return {"batch": batch, "copy_bandwidth_gb_per_s": copy_bw / 1e9, "rows": rows}


def _pass_row(dtype: str, name: str, backend: str, timed: dict, copy_bw: float) -> dict:
    us = timed[f"{backend}_us_per_token"]
    bytes_per_s = timed["min_bytes_per_token"] / (us * 1e-6)
    return {
        "memory_dtype": dtype,
        "pass": name,
        "backend": backend,
        "us_per_token": us,
        "gb_per_s": bytes_per_s / 1e9,
        "fraction_of_copy_bandwidth": bytes_per_s / copy_bw,
    }


def step_part(config, out_dir: str, choices, deadline: float) -> list[dict]:
    """Part (b): the train suite once per `model.kernels` choice, within `deadline`."""
    from gpn_jax.benchmarks import orchestrate

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
        for r in orchestrate.run(c, workdir, "", ["train"], True, True):
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
