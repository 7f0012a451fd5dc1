"""The prepared accelerator run: one command for a lent GPU machine, and its rehearsal here.

    python experiments/bench/accel_bench.py --plan=h100              # here, before booking
    python experiments/bench/accel_bench.py --device --out=DIR      # on the GPU (under 8 min)
    python experiments/bench/accel_bench.py --rehearse --out=DIR    # here: toy shapes, CPU
    python experiments/bench/accel_bench.py --summarise=DIR --out=experiments/results/NAME

`--plan=KIND` (h100 | h200) is the dry run: it checks that `.whl/` holds the wheels the lent
machine installs and prints the plan (`experiments/bench/accel_plan.py`): each record in
order, whether it fits the device's memory, the seconds it takes, and the run's total.
The run: versions first (and whether cuDNN's attention runs), then the parts in order of
value, each in its own process under its own budget, each writing its result file as it goes:
(d) `baselines`, GPN+M, Transformer++ and Gated DeltaNet at 130M at the same tokens per step;
(a) `check`, the Pallas passes against the XLA formulas and 5 training steps pallas against
xla; (c) `step`, the GPN+M batch sweep and float32 memory; (b) `passes`, µs per token and GB/s
against a copy bandwidth; (e) `hlo`, the optimised HLO and a one-step profile. The records are
the plan's for the GPU found (`--kind`), with a persistent compile cache under `runs/`. What runs: `experiments/bench/bench_accel.py`
(settings), `experiments/bench/accel.py` (the files), `experiments/bench/accel_parts.py`
(the parts). The exact command for a lent H200: `experiments/bench/h200_run.sh`.
"""

import os
import sys

# before anything could start a JAX client, in this process or the parts it starts
os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, _ROOT)

from absl import flags  # noqa: E402

from gpn_jax.io import cli  # noqa: E402 - after the path to this checkout

PROG = "accel_bench"
_OUT = flags.DEFINE_string(
    "out", None, "Results folder (at most 8 files); with --summarise, the result files' stem."
)
_PLAN = flags.DEFINE_enum(
    "plan", None, ["h100", "h200"], "Dry run here: check .whl/ and print the device run's plan."
)
_WHEELS = flags.DEFINE_string(
    "wheels", os.path.join(_ROOT, ".whl"), "With --plan: the folder of the wheels the lent "
    "machine installs (h200_run.sh installs .whl/*.whl)."
)  # fmt: skip
_KIND = flags.DEFINE_enum(
    "kind", "auto", ["auto", "h100", "h200"], "With --device: the GPU the plan is for "
    "(auto: nvidia-smi's name)."
)  # fmt: skip
_DEVICE = flags.DEFINE_bool("device", False, "The full run on this machine's accelerator.")
_REHEARSE = flags.DEFINE_bool("rehearse", False, "Every part at toy shapes (a CPU is enough).")
# in order of value: the three families at the same tokens per step (`baselines`), the check,
# the GPN+M sweep and float32 (`step`), the passes, the HLO
_PARTS = flags.DEFINE_list(
    "parts", ["baselines", "check", "step", "passes", "hlo"], "Parts to run, in this order."
)
_SMOKE = flags.DEFINE_bool(
    "smoke", False, "With --device: every part at toy shapes on the device first (its own budget)."
)
_BUDGETS = flags.DEFINE_list(
    "budgets", [], "PART=SECONDS overrides of the parts' budget shares, e.g. baselines=150."
)
_RECORDS = flags.DEFINE_list(
    "step_records", [], "The step part's KERNELS:MEMORY_DTYPE:BATCH[:at_once][:unroll][:graphs] "
    "records, e.g. pallas:float32:128 or pallas:bfloat16:128:at_once:unroll:graphs (the remat "
    "rerun at once, 4 tokens per loop iteration, the loops as CUDA graphs; default: all, in "
    "order of value)."
)  # fmt: skip
_SUMMARISE = flags.DEFINE_string(
    "summarise", None, "A run's folder: write its result files OUT_step.json and "
    "OUT_check.json for tools/render_results.py (no run)."
)  # fmt: skip
_BUDGET = flags.DEFINE_float(
    "budget_s", None, "Seconds the run may take (default: 430 with --device, 900 rehearsing)."
)


def _dry_run(kind: str) -> None:
    from experiments.bench import accel_plan, bench_accel

    found = accel_plan.wheels(_WHEELS.value)
    print(f"{PROG}: {_WHEELS.value}: {', '.join(found)}", flush=True)
    plan = bench_accel.plan(kind)
    print(accel_plan.describe(plan), flush=True)
    if plan["compare_batch"] is None:
        raise ValueError(f"no batch at which the three families fit {kind}; see the plan above")


def _gpu_kind() -> str:
    """h100 or h200 from nvidia-smi's name of GPU 0 (h100, the smaller, when unknown)."""
    import subprocess

    try:
        name = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        name = ""
    kind = "h200" if "H200" in name else "h100"
    print(f"{PROG}: GPU {name.strip() or 'not found'}: the plan for {kind}", flush=True)
    return kind


def _body():
    from experiments.bench import accel, bench_accel

    if _PLAN.value:
        return _dry_run(_PLAN.value)
    if _OUT.value is None:
        raise ValueError("--out is required (the results folder), except with --plan")
    if _SUMMARISE.value:
        from experiments.bench import accel_summary

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
    kind = (_gpu_kind() if _KIND.value == "auto" else _KIND.value) if _DEVICE.value else "h100"
    settings = bench_accel.settings(mode, _BUDGETS.value, _RECORDS.value, kind)
    smoke = bench_accel.settings("rehearse") if _DEVICE.value and _SMOKE.value else None
    runs = accel.run(settings, _OUT.value, budget, _PARTS.value, smoke)
    summary = ", ".join(f"{p} {r['status']}" for p, r in runs.items())
    print(f"{PROG}: {summary}", flush=True)
    print(f"{PROG}: results in {_OUT.value}", flush=True)


main, entry = cli.absl_entry(_body, PROG, quiet=False)


if __name__ == "__main__":
    entry()
