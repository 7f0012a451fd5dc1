"""The prepared accelerator run, one command for a lent GPU (or TPU) machine:

    python experiments/bench/accel_bench.py --out=runs/accel [--parts=passes,step] [--budget_s=420]

(a) `passes`: the memory's passes at the 130M shapes (15 heads x 128 x 256, batch 128), XLA
against Pallas, with float32 and bfloat16 storage: microseconds per token and GB/s against a
copy bandwidth measured in the same run; (b) `step`: the 130M training step
(`experiments/bench/bench_accel.py`: bfloat16 compute, T = 2048) at batch 128 with
`model.kernels=xla` and `=pallas`, each in its own process with a timeout. It writes
<out>/accel.json after each part, and each step's tables and optimised HLO under
<out>/step_<kernels>/. Everything runs within `--budget_s` seconds (compiles included), so a
caller's 8-minute limit leaves the JSON of every part that finished. What each figure means:
`gpn_jax/benchmarks/accel.py`.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from gpn_jax.io import cli  # noqa: E402 - after the path to this checkout

PROG = "accel_bench"
_HERE = os.path.dirname(os.path.abspath(__file__))
_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(_HERE, "bench_accel.py"), "Bench config (bench_accel.py)."
)
_OUT = flags.DEFINE_string("out", None, "Output folder: accel.json, tables, HLO.")
_PARTS = flags.DEFINE_list("parts", ["passes", "step"], "Parts to run: passes, step.")
_BUDGET = flags.DEFINE_float("budget_s", 420.0, "Seconds the whole run may take.")
flags.mark_flags_as_required(["out"])


def _body():
    from gpn_jax.benchmarks import accel

    unknown = sorted(set(_PARTS.value) - {"passes", "step"})
    if unknown:
        raise ValueError(f"unknown --parts {unknown}; choose from passes, step")
    config = cli.config_or_exit(_CONFIG, PROG)
    result = accel.run(config, _OUT.value, _BUDGET.value, _PARTS.value)
    print(f"{PROG}: wrote {os.path.join(_OUT.value, 'accel.json')}", flush=True)
    return result


main, entry = cli.absl_entry(_body, PROG, quiet=False)


if __name__ == "__main__":
    entry()
