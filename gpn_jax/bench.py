"""Benchmarks: training tokens/s and MFU side by side, scaling in T and B, generation latency.

    python -m gpn_jax.bench --config=experiments/bench/bench_small.py --workdir=/tmp/gpn_bench \\
        --out=/tmp/gpn_bench/small.json [--profile] [--suites=train,scaling,generate] \\
        [--device_spec=h100,h200,v5e,v5p]

Suites (the config's `suites`, or `--suites`):
  train     each model of `config.train.models` at the same batch and window: median step time
            (jitted loss + gradients + clipped AdamW, after compile and warm-up), tokens/s,
            achieved FLOP/s from the analytic `model.flops_per_token`, MFU, peak memory;
  scaling   `config.scaling.model` vs T and vs B, remat off and on (segment ~ sqrt(T)); PNG plot;
  generate  per-token decoding latency and tokens/s after 1k / 8k / 32k tokens of context;
  alternate `config.alternate.models` in one process at the train suite's batch and window,
            one step of each in turn per round (order rotated): the median per-round ratio of
            step times against `config.alternate.reference`, which a shared machine's drift
            over minutes does not move (`benchmarks.train.run_alternating`).

Roofline: the header names the CPU's vector extensions (/proc/cpuinfo) and the memory
bandwidth measured in the same run (a jitted JAX `x <- -x`, buffer donated, over a 256 MiB
float32 array: STREAM "scale", read + write, best of 5, at the start and at the end); each
training record carries the model's analytic bytes per token (`model.bytes_per_token`:
weights, weight gradients, activations, the GPN+M memory matrix, logits), and the report
prints the roofline bound per token (max of FLOPs / peak and bytes / bandwidth) and the
achieved fraction of it, plus the bound on each accelerator of
`--device_spec=h100,h200,v5e,v5p` from its data sheet (`benchmarks/roofline.py`; no
accelerator is measured by that flag).

MFU = achieved FLOP/s / the matmul peak measured in this run on this machine: a large jitted
square matmul in the compute dtype (float32 on CPU, bfloat16 on GPU / TPU), timed at the start,
after every record and at the end; the best time is the peak. Peak memory is the peak host RSS
on CPU (each record runs in its own process, so the peak is that record's) and
`memory_stats()["peak_bytes_in_use"]` on GPU / TPU. Times are wall clock: on a shared machine
other jobs lower them (compare `load_average` in the output). Nothing here asserts on time.

Outputs: `--out` (default <workdir>/<config name>.json): a JSON list, one record per
model/config (keys include model, config, tokens_per_s, mfu, peak_mem_bytes);
<workdir>/<config name>.md: the tables; <workdir>/<config name>_scaling.png: the plot;
with `--profile`, <workdir>/profile/<model>/: a `jax.profiler` trace of one training step, the
step's optimised HLO (`train_step.hlo.txt`) and `ops.md`: its operations' self times per loop
and the largest ones, with shapes and call counts (`gpn_jax/benchmarks/op_profile.py`).
"""

import os

# On GPU the parent (peak matmul) and each record's worker process share the device: no
# process may grab most of its memory up front. Set before JAX is imported.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from gpn_jax.io import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Benchmark config (experiments/bench/bench_*.py)."
)
_WORKDIR = flags.DEFINE_string(
    "workdir",
    "",
    "Directory for the JSON, tables, plot, profiles (default: a new private temporary one).",
)
_OUT = flags.DEFINE_string("out", "", "JSON results file (default <workdir>/<config name>.json).")
_SUITES = flags.DEFINE_string(
    "suites", "", "Comma-separated suites to run (default: the config's)."
)
_PROFILE = flags.DEFINE_bool(
    "profile",
    False,
    "Save a jax.profiler trace of one training step per model, and its per-operation table.",
)
_ISOLATE = flags.DEFINE_bool(
    "isolate",
    True,
    "Run each record in its own process (per-record peak RSS); off: all in this one.",
)
_DEVICE_SPEC = flags.DEFINE_string(
    "device_spec",
    "",
    "Comma-separated accelerators (h100,h200,v5e,v5p) whose data-sheet roofline is printed "
    "next to this machine's.",
)
flags.mark_flags_as_required(["config"])

PROG = "gpn-bench"


def _body():
    from gpn_jax.benchmarks import orchestrate

    config = cli.config_or_exit(_CONFIG, PROG)
    suites = orchestrate.names(_SUITES.value or config.suites)
    return orchestrate.run(
        config,
        _WORKDIR.value,
        _OUT.value,
        suites,
        _PROFILE.value,
        _ISOLATE.value,
        _DEVICE_SPEC.value,
    )


main, entry = cli.absl_entry(_body, PROG, quiet=False)


if __name__ == "__main__":
    entry()
