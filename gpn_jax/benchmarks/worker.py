"""Runs one benchmark spec and writes its records: `python -m gpn_jax.benchmarks.worker SPEC_JSON OUT_JSON`.

A fresh process per spec makes each record's peak host RSS its own (the process peak is
monotone, so records measured in one process would inherit each other's peaks). After the
timed work the worker also measures the matmul peak once more, so load on a shared machine
is sampled throughout the run.
"""

import json
import sys

from gpn_jax.io import files, untrusted


def run_spec(spec: dict) -> dict:
    from gpn_jax.benchmarks import generate, measure, train

    if spec["suite"] == "generate":
        records = generate.run(spec)
    elif spec["suite"] == "alternate":
        records = train.run_alternating(spec)
    else:
        records = [train.run(spec)]
    dtype = measure.resolve_dtype(spec["compute_dtype"])
    peak = measure.peak_matmul_flops(dtype, spec.get("peak_size", 0), spec.get("peak_reps", 3))
    return {"records": records, "peak_flops": [peak]}


def main(argv):
    spec_path, out_path = argv[1], argv[2]
    spec = untrusted.read_json(
        spec_path, fix="pass a spec written by gpn_jax.benchmarks.orchestrate"
    )
    if spec["suite"] != "generate" and spec.get("reuse_step_memory", True):  # as the trainer
        from gpn_jax.training import host_memory

        host_memory.inline_cpu_steps()  # (before JAX starts; `training.host_memory`)
    result = run_spec(spec)
    files.atomic_write(out_path, json.dumps(result).encode())


if __name__ == "__main__":
    main(sys.argv)
