"""The prepared accelerator run: one command for a lent GPU machine, and its rehearsal here.

    python experiments/bench/accel_bench.py --device --out=DIR      # on the GPU (under 8 min)
    python experiments/bench/accel_bench.py --rehearse --out=DIR    # here: toy shapes, CPU
    python experiments/bench/accel_bench.py --summarise=DIR --out=experiments/results/NAME

Versions first, then (with --device) a smoke test of every part at toy shapes, then the parts
in order of value, each in its own process under its own budget, each writing its result file
as it goes: (a) `check`, the Pallas passes against the XLA formulas and 5 training steps pallas
against xla; (b) `passes`, µs per token and GB/s against a copy bandwidth; (c) `step`, the 130M
GPN+M step at B = 128 (xla / pallas, float32 / bfloat16 memory), then smaller batches; (d)
`baselines`, Transformer++ and Gated DeltaNet at 130M at the same tokens per step; (e) `hlo`,
the optimised HLO and a one-step profile. What runs: `experiments/bench/bench_accel.py`
(settings), `gpn_jax/benchmarks/accel.py` (the files), `gpn_jax/benchmarks/accel_parts.py`
(the parts). The exact command for a lent H200: `experiments/bench/h200_run.sh`.
"""

import os
import sys

# before anything could start a JAX client, in this process or the parts it starts
os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from absl import flags  # noqa: E402

from gpn_jax.io import cli  # noqa: E402 - after the path to this checkout

PROG = "accel_bench"
_OUT = flags.DEFINE_string(
    "out", None, "Results folder (at most 8 files); with --summarise, the result files' stem."
)
_DEVICE = flags.DEFINE_bool("device", False, "The full run on this machine's accelerator.")
_REHEARSE = flags.DEFINE_bool("rehearse", False, "Every part at toy shapes (a CPU is enough).")
_PARTS = flags.DEFINE_list(
    "parts", ["check", "passes", "step", "baselines", "hlo"], "Parts to run, in this order."
)
_SMOKE = flags.DEFINE_bool(
    "smoke", True, "With --device: every part at toy shapes on the device first (its own budget)."
)
_BUDGETS = flags.DEFINE_list(
    "budgets", [], "PART=SECONDS overrides of the parts' budget shares, e.g. baselines=150."
)
_RECORDS = flags.DEFINE_list(
    "step_records", [], "The step part's KERNELS:MEMORY_DTYPE:BATCH records, e.g. "
    "pallas:float32:128 (default: all, in order of value)."
)  # fmt: skip
_SUMMARISE = flags.DEFINE_string(
    "summarise", None, "A run's folder: write its result files OUT_step.json and "
    "OUT_check.json for tools/render_results.py (no run)."
)  # fmt: skip
_BUDGET = flags.DEFINE_float(
    "budget_s", None, "Seconds the run may take (default: 430 with --device, 900 rehearsing)."
)
flags.mark_flags_as_required(["out"])


def _body():
    from experiments.bench import bench_accel
    from gpn_jax.benchmarks import accel

    if _SUMMARISE.value:
        from gpn_jax.benchmarks import accel_summary

        for path in accel_summary.write(_SUMMARISE.value, _OUT.value):
            print(f"{PROG}: wrote {path}", flush=True)
        return
    if _DEVICE.value == _REHEARSE.value:
        raise ValueError("pass exactly one of --device (the accelerator run) and --rehearse")
    unknown = sorted(set(_PARTS.value) - set(accel.PARTS))
    if unknown:
        raise ValueError(f"unknown --parts {unknown}; choose from {', '.join(accel.PARTS)}")
    mode = "device" if _DEVICE.value else "rehearse"
    budget = _BUDGET.value or (430.0 if _DEVICE.value else 900.0)
    settings = bench_accel.settings(mode, _BUDGETS.value, _RECORDS.value)
    smoke = bench_accel.settings("rehearse") if _DEVICE.value and _SMOKE.value else None
    runs = accel.run(settings, _OUT.value, budget, _PARTS.value, smoke)
    summary = ", ".join(f"{p} {r['status']}" for p, r in runs.items())
    print(f"{PROG}: {summary}", flush=True)
    print(f"{PROG}: results in {_OUT.value}", flush=True)


main, entry = cli.absl_entry(_body, PROG, quiet=False)


if __name__ == "__main__":
    entry()
