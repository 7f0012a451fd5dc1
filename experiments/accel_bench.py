"""The README's accelerator figure in one command, for a machine with a GPU/TPU:

    python experiments/accel_bench.py --config=experiments/configs/bench_accel.py \
        --workdir=runs/accel --device_spec=h100,h200

The config (`experiments/configs/bench_accel.py`) is the paper's 130M GPN+M at T = 2048 in
bfloat16. The bench's `train` suite runs it (`gpn_jax.bench.run`), once per candidate batch of
`config.train.batch_sizes`, largest first, until one runs. Each run measures the device's
matmul peak and memory bandwidth and reports the step's tokens/s, MFU and roofline fraction,
plus the `--device_spec` data-sheet bounds.

A candidate that runs out of device memory is reported and the next one is tried. Any other
failure stops the script with its one-line error, so that a bug never passes for "did not fit".

It takes the flags `--profile`, `--isolate`, `--out` as `gpn_jax.bench` does; its suite is
always `train`. The run writes <workdir>/bench_accel.{json,md} for the batch that ran; its last
line is the figure: device, batch, tokens/s, MFU, and the fraction of the device's roofline
bound. It needs only what `gpn_jax.bench` imports: on an offline machine whose image already
holds JAX, Flax and Optax, install the wheels of ml-collections and zstandard if they are missing.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from gpn_jax import cli  # noqa: E402 - after the path to this checkout
from gpn_jax.benchmarks import runner  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Bench config (bench_accel.py).")
_WORKDIR = flags.DEFINE_string("workdir", "", "Output directory (default: a new private one).")
_OUT = flags.DEFINE_string("out", "", "JSON results file (default <workdir>/<config name>.json).")
_PROFILE = flags.DEFINE_bool("profile", False, "Save a profile of one training step.")
_ISOLATE = flags.DEFINE_bool("isolate", True, "Run each record in its own process.")
_DEVICE_SPEC = flags.DEFINE_string("device_spec", "", "Data-sheet rooflines to print (h100,h200).")
flags.mark_flags_as_required(["config"])

PROG = "accel_bench"
# What XLA says when an allocation does not fit, lower-cased (GPU: "RESOURCE_EXHAUSTED: Out of
# memory while trying to allocate ..."; TPU: "... Ran out of memory in memory space hbm").
OOM_MARKERS = ("resource_exhausted", "out of memory")


def out_of_memory(error: str) -> bool:
    """True when a failed record's error says the device ran out of memory."""
    return any(m in error.lower() for m in OOM_MARKERS)


def largest_that_runs(config, workdir: str, device_spec: str, run) -> list[dict]:
    """`run(config, workdir, device_spec)` (the bench's records) for each candidate batch,
    largest first, until one runs without error: that run's records. A candidate that runs out
    of memory is reported and skipped; any other error raises."""
    sizes = sorted(config.train.batch_sizes, reverse=True)
    if not sizes or min(sizes) < 1:
        raise ValueError(f"train.batch_sizes must be positive batch sizes, got {sizes}")
    for B in sizes:
        config.train.batch_size = B
        records = run(config, workdir, device_spec)
        errors = [r["error"] for r in records if r.get("error")]
        if not errors:
            return records
        if not all(out_of_memory(e) for e in errors):
            first = errors[0].strip().splitlines()[0]
            raise RuntimeError(f"batch {B} failed, not for lack of memory: {first}")
        print(f"{PROG}: batch {B} did not fit in device memory; trying the next", flush=True)
    raise RuntimeError(f"no batch of {sizes} fits in device memory")


def figure(records: list[dict]) -> str:
    """The README's line: device, batch, tokens/s, MFU and the fraction of the roofline bound."""
    from gpn_jax.benchmarks import roofline

    r = next(r for r in records if r.get("suite") == "train")
    byt = r["bytes_per_token"]["train"]
    tps, by = roofline.bound(r["flops_per_token"], byt, r["peak_flops"], r["memory_bandwidth"])
    return (
        f"{r['machine']} ({r['platform']}): {r['model']} B={r['batch_size']} "
        f"T={r['seq_len']}: {r['tokens_per_s']:,.0f} tokens/s, MFU {100 * r['mfu']:.1f} %, "
        f"{r['tokens_per_s'] / tps:.2f} of the roofline bound ({tps:,.0f} tokens/s, {by}-bound)"
    )


def _run_bench(config, workdir: str, device_spec: str) -> list[dict]:
    return runner.run(
        config, workdir, _OUT.value, ["train"], _PROFILE.value, _ISOLATE.value, device_spec
    )


def _body():
    config = cli.config_or_exit(_CONFIG, PROG)
    records = largest_that_runs(config, _WORKDIR.value, _DEVICE_SPEC.value, _run_bench)
    print(f"\n{PROG}: largest batch that ran: {figure(records)}", flush=True)


main, entry = cli.absl_entry(_body, PROG, quiet=False)


if __name__ == "__main__":
    entry()
