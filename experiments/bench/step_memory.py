"""What keeping a training step's buffers between steps saves: the same step in two processes.

    python experiments/bench/step_memory.py [--rounds=12] [--model=gpn_m]

One process runs the `bench_small` training step of `--model` as JAX runs it by default (the
compiler's freed heap released after compiling, nothing else); the other as the trainer does
(`train.reuse_step_memory`: each step inline on the calling thread, its freed buffers kept in
the C heap for the next; `gpn_jax/training/host_memory.py`). After compiling and two warm-up
steps each, they are stepped in turn, the order alternating each round, so a shared machine's
drift slows both alike. Printed per process: median and best step time, minor page faults and
system CPU time per step (medians), peak RSS; then the median over rounds of the ratio of their
step times. Nothing is asserted.
"""

import json
import os
import resource
import statistics
import subprocess
import sys
import time

from absl import app, flags

_ROUNDS = flags.DEFINE_integer("rounds", 12, "Steps of each process, taken in turn.")
_MODEL = flags.DEFINE_string("model", "gpn_m", "A model of experiments/bench/bench_small.py.")
_WORKER = flags.DEFINE_enum("worker", None, ["default", "reuse"], "Internal: run one process.")

SETTINGS = ("default", "reuse")


def _spec(model: str, reuse: bool) -> dict:
    from gpn_jax.benchmarks import bench_config

    t = bench_config.base_config("bench_small", "train").train
    return dict(
        suite="train",
        compute_dtype="auto",
        batch_size=t.batch_size,
        seq_len=t.seq_len,
        reuse_step_memory=reuse,
        model=bench_config.models()[model].to_dict(),
    )


def worker(model: str, setting: str) -> None:
    """Compiles the step, answers 'ready', then runs one step per input line and prints
    (seconds, minor faults, system seconds, peak RSS bytes)."""
    from gpn_jax.training import host_memory

    reuse = setting == "reuse"
    if reuse:
        host_memory.inline_cpu_steps()  # before JAX starts, as the trainer's launcher
    import jax

    from gpn_jax.benchmarks import train

    spec = _spec(model, reuse)
    one = train.compiled_step(spec, spec["model"])[0]
    for _ in range(2):
        jax.block_until_ready(one())
    print("ready", flush=True)
    for _ in sys.stdin:
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        jax.block_until_ready(one())
        seconds, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        faults, system = r1.ru_minflt - r0.ru_minflt, r1.ru_stime - r0.ru_stime
        print(json.dumps([seconds, faults, system, r1.ru_maxrss * 1024]), flush=True)


def _start(setting: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        f"--worker={setting}",
        f"--model={_MODEL.value}",
    ]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "ready":
        raise SystemExit(f"step_memory: the {setting} worker failed to start")
    return proc


def main(argv):
    del argv
    if _WORKER.value:
        return worker(_MODEL.value, _WORKER.value)
    procs = {s: _start(s) for s in SETTINGS}
    rows = {s: [] for s in SETTINGS}
    for r in range(_ROUNDS.value):
        for s in SETTINGS if r % 2 == 0 else SETTINGS[::-1]:
            procs[s].stdin.write("step\n")
            procs[s].stdin.flush()
            rows[s].append(json.loads(procs[s].stdout.readline()))
    for p in procs.values():
        p.stdin.close()
        p.wait()
    print(f"{_MODEL.value}, bench_small training step, {_ROUNDS.value} rounds")
    for s in SETTINGS:
        t, faults, system, rss = zip(*rows[s], strict=True)
        print(
            f"  {s:8s} step median {statistics.median(t):.3f} s (best {min(t):.3f}), "
            f"minor faults {statistics.median(faults):,.0f}, system {statistics.median(system):.3f}"
            f" s a step, peak RSS {rss[-1] / 2**30:.2f} GiB"
        )
    ratios = [a[0] / b[0] for a, b in zip(rows["reuse"], rows["default"], strict=True)]
    faster = sum(x < 1 for x in ratios)
    print(
        f"  reuse / default step time: median {statistics.median(ratios):.3f} "
        f"({faster} of {len(ratios)} rounds faster)"
    )


if __name__ == "__main__":
    app.run(main)
