"""The MQAR grid's compute floor: how long `experiments.recall_sweep` must take on this machine.

    python -m experiments.recall_floor --config=experiments/configs/recall_sweep.py

For every family of the sweep config, in every cell, it times the training step the sweep's
runs take (the trainer's own jitted step at the cell's batch and sequence length, on one
device, after warm-up; best of `--repeats` timings of `--steps` steps) and prints it next to
the step's FLOPs (`model.flops_per_token(seq_len)["train"]` x batch x seq_len), the FLOP/s it
reaches and that as a fraction of the float32 matmul peak measured in the same run
(`gpn_jax.benchmarks.measure.peak_matmul_flops`). Then, over the whole grid (every family, cell,
learning rate and seed at `steps` steps): the total FLOPs, the time they take at the measured
peak (the floor no implementation beats), and the time at the measured step times (stepping
only: compile, data and evaluation come on top). Nothing is trained or written.

The steps are timed the way the sweep runs them: with the sweep's `workers` (0: one per CPU
core) above 1, each step is timed in that many single-core worker processes at once
(`gpn_jax.parallel.core_pool`, as the sweep's runs share the machine) and the grid's stepping
time is the per-run time over the workers; with 1, in this process on every core.
"""

import functools

import jax
import ml_collections
from absl import flags

from experiments import recall_sweep
from gpn_jax.io import cli
from gpn_jax.parallel import core_pool


def measure(sweep, family: str, cell, steps: int, repeats: int) -> tuple[float, float]:
    """(best wall seconds per training step, training FLOPs per step by the model's own
    accounting) of one run of `family` in `cell`."""
    from gpn_jax.benchmarks.measure import time_calls
    from gpn_jax.models import factory
    from gpn_jax.parallel import mesh as meshlib
    from gpn_jax.training import setup

    pairs, seq_len, width = cell
    fields = recall_sweep.model_fields(family, width, seq_len, sweep)
    config = recall_sweep.run_config(sweep, fields, pairs, seq_len, sweep.learning_rates[0], 0)
    model = factory.build_model(fields)
    one = ml_collections.ConfigDict({"data": 1, "fsdp": 1, "tensor": 1})
    built = setup.build(config, meshlib.make_mesh(one, jax.devices()[:1]), model)
    with jax.set_mesh(built.mesh):
        state = built.init_state(jax.random.PRNGKey(0))
        shape = (sweep.batch_size, seq_len)
        tokens = jax.random.randint(jax.random.PRNGKey(1), shape, 0, fields["vocab_size"])
        tokens = jax.device_put(tokens, built.batch_target().sharding)
        step = built.train_step.lower(state, tokens).compile()

    def run_steps(n: int):
        nonlocal state
        for _ in range(n):
            state, metrics = step(state, tokens)
        return metrics

    jax.block_until_ready(run_steps(1))  # warm-up
    seconds = min(time_calls(lambda: run_steps(steps), repeats)) / steps
    return seconds, model.flops_per_token(seq_len)["train"] * sweep.batch_size * seq_len


def _measure_task(task: tuple) -> tuple[float, float]:
    return measure(*task)


def measure_side_by_side(sweep, family, cell, steps, repeats, workers) -> tuple[float, float]:
    """`measure` in `workers` single-core processes at once: (mean seconds per step, FLOPs)."""
    task = (sweep, family, cell, steps, repeats)
    setup = functools.partial(recall_sweep.worker_setup, None)  # as the sweep's workers
    pairs = core_pool.map_unordered(_measure_task, [task] * workers, workers, worker_setup=setup)
    out = [r for _, r in pairs]
    return sum(s for s, _ in out) / len(out), out[0][1]


def floor(sweep, steps: int, repeats: int, peak: float, log=print) -> dict:
    """Per (cell, family) step time and FLOPs; the grid's totals (see the module doc)."""
    runs_per_family = len(sweep.learning_rates) * len(sweep.seeds)
    workers = core_pool.auto_workers(sweep.get("workers", 0))
    rows, total_flops, total_s = [], 0.0, 0.0
    for cell in recall_sweep.cells(sweep):
        for family in recall_sweep.families(sweep):
            if workers > 1:
                s, f = measure_side_by_side(sweep, family, cell, steps, repeats, workers)
            else:
                s, f = measure(sweep, family, cell, steps, repeats)
            rows.append(dict(cell=cell, family=family, step_s=s, step_flops=f))
            total_flops += f * sweep.steps * runs_per_family
            total_s += s * sweep.steps * runs_per_family / workers
            log(f"pairs={cell[0]} T={cell[1]} width={cell[2]} {family:12s} {s * 1e3:7.1f} ms/step "
                f"{f / 1e9:6.3f} GFLOP/step {f / s / 1e9:6.1f} GFLOP/s ({f / s / peak:.0%} of peak)")  # fmt: skip
    log(f"grid: {total_flops / 1e12:.1f} TFLOP over {sweep.steps} steps x {runs_per_family} runs "
        f"per family and cell; at the matmul peak {peak / 1e9:.1f} GFLOP/s: "
        f"{total_flops / peak / 60:.1f} min; at the measured steps: {total_s / 60:.1f} min "
        f"(stepping only, {workers} run(s) at a time)")  # fmt: skip
    return dict(rows=rows, total_flops=total_flops, floor_s=total_flops / peak, steps_s=total_s,
                workers=workers)  # fmt: skip


# ------------------------------------------------------------------------------ CLI
_CONFIG = recall_sweep._CONFIG  # the sweep's own --config flag (defined once per process)
_STEPS = flags.DEFINE_integer("steps", 50, "Steps per timing.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timings per model (the best is kept).")


def _body():
    if _CONFIG.value is None:
        raise ValueError("--config is required")
    if _STEPS.value < 1 or _REPEATS.value < 1:
        raise ValueError(
            f"--steps and --repeats must be >= 1, got {_STEPS.value}, {_REPEATS.value}"
        )
    from gpn_jax.benchmarks.measure import peak_matmul_flops

    peak = peak_matmul_flops("float32")
    recall_sweep.check_cells(_CONFIG.value)
    floor(_CONFIG.value, _STEPS.value, _REPEATS.value, peak, log=lambda s: print(s, flush=True))


main, run = cli.absl_entry(_body, "recall_floor")

if __name__ == "__main__":
    run()
