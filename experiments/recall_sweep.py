"""MQAR by the standard protocol: four families at matched parameters over a grid, best LR per cell.

    python -m experiments.recall_sweep --config=experiments/configs/recall_sweep.py --workdir=/tmp/mqar

For every cell (pairs, seq_len, width) of the config, every family (GPN+M, GPN, Gated DeltaNet,
Transformer++, sized to GPN+M's parameter count) trains with every learning rate and seed by
the normal trainer on `recall:...,examples=0` data (fresh examples every step, loss on the
answers only: `gpn_jax.data.recall`), then is scored on the cell's held-out examples
(`gpn_jax.eval.recall`: top-1 accuracy over every query). Per cell and family the learning
rate with the best mean accuracy over seeds is kept, as Zoology and the Gated DeltaNet paper
report MQAR. Each run lives in `<workdir>/<cell>/<family>/lr<lr>_s<seed>`; a rerun reuses
finished runs (`recall_result.json`), so the sweep can be stopped and resumed.

Runs train side by side, one single-core process per CPU core (`--config.workers`, 0 = one per
core on CPU, 1 = one after the other in this process; `gpn_jax.parallel.core_pool`), each
keeping freed buffers in its heap and all sharing one compile cache (`worker_setup`). On 2 cores,
two workers finished a cell's runs in less time than one worker did (about 1.1-1.5x faster,
depending on the model and the machine).
Training the learning-rate x seed runs of a cell as one `jax.vmap`-ed program was measured and
not kept: it cost 0.8-1.7x per run what one run's step costs (XLA:CPU runs the batched matmuls
off its fast path).

`--config.report_only=True` only tabulates the finished runs (a partial grid; rows list the
seeds they hold), so several processes can share the grid (e.g. one per `--config.families`
subset) and one more call writes the joint table. Outputs in the workdir: `recall_table.md`, `recall_table.json` and `recall_vs_pairs.png`
(accuracy vs number of pairs, one line per family, one panel per (seq_len, width)).
"""

import collections
import functools
import json
import os
import time

from absl import flags
from ml_collections import config_flags

from gpn_jax.checkpoints.restore import load_run
from gpn_jax.configs import recipe
from gpn_jax.eval.recall import recall_eval
from gpn_jax.io import cli
from gpn_jax.io.files import atomic_write
from gpn_jax.models import factory
from gpn_jax.parallel import core_pool
from gpn_jax.training import host_memory
from gpn_jax.training.loop import train_and_evaluate

RESULT, TABLE_MD, TABLE_JSON, PLOT = (
    "recall_result.json",
    "recall_table.md",
    "recall_table.json",
    "recall_vs_pairs.png",
)
COMPILE_CACHE = "compile_cache"  # the pool workers' shared persistent compilation cache


# ------------------------------------------------------------------------------ models
def model_fields(family: str, width: int, seq_len: int, sweep) -> dict:
    """Model `family`'s block at `width`, matched to GPN+M's parameter count
    (`gpn_jax.models.factory.matched`)."""
    size = factory.Width(width, 3 + 2 * sweep.n_keys, seq_len, sweep.heads, sweep.ffn_mult,
                         sweep.gdn_layers, sweep.transformer_layers, gdn_chunk=min(64, seq_len),
                         loss_chunk=32)  # fmt: skip
    return factory.matched(family, size)


def run_config(sweep, fields: dict, pairs: int, seq_len: int, lr: float, seed: int):
    """A training config for one run: fresh answer-only MQAR examples, the sweep's recipe."""
    c = recipe.base_config()
    c.seed = seed
    c.model = recipe.model_block(fields)
    k = sweep.n_keys
    c.data.source = f"recall:pairs={pairs},keys={k},values={k},examples=0,heldout={sweep.heldout}"
    c.train.update(dict(batch_size=sweep.batch_size, seq_len=seq_len, steps=sweep.steps,
                        warmup_steps=sweep.warmup_steps, learning_rate=lr,
                        log_every=max(1, sweep.steps // 10), eval_every=0,
                        checkpoint_every=sweep.steps, keep_checkpoints=1, keep_best=0,
                        async_checkpoints=False, final_eval_batches=1))  # fmt: skip
    return c


# ------------------------------------------------------------------------------ runs
def train_one(config, workdir: str, heldout: int) -> dict:
    """Trains (unless `workdir` holds a finished result) and scores one run."""
    done = read_result(workdir)
    if done is not None:
        return done
    start = time.time()
    train_and_evaluate(config, workdir)
    r = recall_eval(load_run(workdir), heldout)
    result = {
        "acc": r["acc"],
        "acc_by_query": r["acc_by_query"],
        "chance": r["chance"],
        "params": factory.n_params(config.model.to_dict()),
        "wall_s": round(time.time() - start, 1),
        "cpus": core_pool.usable_cpus(),  # the cores it ran on (1 in a pool's worker)
    }
    atomic_write(os.path.join(workdir, RESULT), json.dumps(result, indent=2).encode())
    return result


def cells(sweep):
    return [(p, t, w) for p in sweep.pairs for t in sweep.seq_lens for w in sweep.widths]


def families(sweep) -> list[str]:
    return factory.variant_keys(sweep.families)


def check_cells(sweep) -> None:
    """Every cell's pairs must fit its window (fails before any training)."""
    for pairs, seq_len, _ in cells(sweep):
        if seq_len < 2 * pairs + 2:
            raise ValueError(
                f"cell pairs={pairs}, seq_len={seq_len}: {pairs} key-value pairs leave no room "
                f"for a query (needs seq_len >= {2 * pairs + 2})"
            )
        if pairs > sweep.n_keys:
            raise ValueError(f"cell pairs={pairs} needs pairs <= keys ({sweep.n_keys})")


def run_dir(workdir: str, cell, family: str, lr: float, seed: int) -> str:
    pairs, seq_len, width = cell
    return os.path.join(workdir, f"p{pairs}_t{seq_len}_w{width}", family, f"lr{lr:g}_s{seed}")


def read_result(wd: str) -> dict | None:
    path = os.path.join(wd, RESULT)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def plan(sweep) -> list[tuple]:
    """Every run of the grid as (cell, family, lr, seed), the headline cell first. Seeds vary
    slowest within a family: runs side by side then differ in learning rate (a different
    program each), and a later seed's run finds its program in the shared compile cache."""
    return [(cell, family, lr, seed) for cell in cells(sweep) for family in families(sweep)
            for seed in sweep.seeds for lr in sweep.learning_rates]  # fmt: skip


def _train_task(task: tuple) -> dict:
    """One run, here or in a worker process (`gpn_jax.parallel.core_pool`)."""
    return train_one(*task)


def worker_setup(cache_dir: str | None) -> None:
    """A pool worker's setup, before it trains anything:

    - freed buffers stay in the C heap for the next step (`host_memory.reuse_freed_heap`:
      Gated DeltaNet's single-core step 64 -> 42 ms, its page faults 17x fewer);
    - with `cache_dir`, compiles go through one persistent cache shared by all workers
      (unless the user set their own): runs that differ only in seed compile the same
      programs, so the first compiles them and the next reads them back.
    """
    import jax

    host_memory.reuse_freed_heap()
    if cache_dir and not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def train_grid(sweep, workdir: str, log, on_group_done) -> None:
    """Trains every unfinished run, `sweep.workers` at a time (0: one single-core process per
    CPU core), logging each as it finishes; `on_group_done()` after the last run of a
    (cell, family) finishes."""
    todo = [run for run in plan(sweep) if read_result(run_dir(workdir, *run)) is None]
    workers = core_pool.auto_workers(sweep.get("workers", 0))
    fields = {(c, f): model_fields(f, c[2], c[1], sweep) for c, f, _, _ in todo}
    tasks = []
    for c, f, lr, seed in todo:
        config = run_config(sweep, fields[c, f], c[0], c[1], lr, seed)
        config.logging.progress_bar = workers == 1  # side by side, bars would overwrite each other
        tasks.append((config, run_dir(workdir, c, f, lr, seed), sweep.heldout))
    if todo:
        log(f"{len(todo)} runs to train, {workers} at a time")
    left = collections.Counter((c, f) for c, f, _, _ in todo)
    setup = functools.partial(worker_setup, os.path.join(workdir, COMPILE_CACHE))
    for i, r in core_pool.map_unordered(_train_task, tasks, workers, worker_setup=setup):
        cell, family, lr, seed = todo[i]
        log(f"pairs={cell[0]} T={cell[1]} width={cell[2]} {family} lr={lr:g} seed={seed}: "
            f"acc {r['acc']:.4f} ({r['wall_s']} s)")  # fmt: skip
        left[cell, family] -= 1
        if not left[cell, family]:
            on_group_done()


def cell_row(sweep, workdir: str, cell, family: str) -> dict | None:
    """One family's row in one cell from its finished runs: the learning rate with the best
    mean accuracy over seeds (None when no run has finished)."""
    pairs, seq_len, width = cell
    by_lr = {}
    for lr in sweep.learning_rates:
        results = [read_result(run_dir(workdir, cell, family, lr, s)) for s in sweep.seeds]
        accs = [r["acc"] for r in results if r is not None]
        if accs:
            by_lr[lr] = accs
    if not by_lr:
        return None
    best = max(by_lr, key=lambda lr: sum(by_lr[lr]) / len(by_lr[lr]))
    accs = by_lr[best]
    return {
        "pairs": pairs, "seq_len": seq_len, "width": width, "family": family,
        "model": factory.label(family),
        "params": factory.n_params(model_fields(family, width, seq_len, sweep)),
        "best_lr": best, "acc": sum(accs) / len(accs), "acc_by_seed": accs,
        "chance": 1.0 / sweep.n_keys, "acc_by_lr": {f"{lr:g}": v for lr, v in by_lr.items()},
    }  # fmt: skip


def recall_sweep(sweep, workdir: str, log=print) -> dict:
    """Runs the whole grid (unless `report_only`), then tabulates every finished run; writes
    and returns the table ({'rows': [...], 'config': ..., 'wall_s': ...})."""
    names = families(sweep)
    check_cells(sweep)
    os.makedirs(workdir, exist_ok=True)
    start = time.time()

    def tabulate() -> dict:  # every finished run so far (partial tables while training)
        rows = [cell_row(sweep, workdir, cell, f) for cell in cells(sweep) for f in names]
        return write_outputs(workdir, [r for r in rows if r], sweep, time.time() - start)

    if not sweep.get("report_only"):
        train_grid(sweep, workdir, log, on_group_done=tabulate)
    return tabulate()


# ------------------------------------------------------------------------------ outputs
def table_md(rows: list[dict]) -> str:
    head = "| Pairs | T | Width | Model | Params | Best LR | Accuracy (mean over seeds) | Seeds |"
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        seeds = ", ".join(f"{a:.3f}" for a in r["acc_by_seed"])
        lines.append(f"| {r['pairs']} | {r['seq_len']} | {r['width']} | {r['model']} | "
                     f"{r['params']:,} | {r['best_lr']:g} | {r['acc']:.3f} | {seeds} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def write_outputs(workdir: str, rows: list[dict], sweep, wall_s: float) -> dict:
    table = {"rows": rows, "config": sweep.to_dict(), "wall_s": round(wall_s, 1)}
    atomic_write(os.path.join(workdir, TABLE_JSON), json.dumps(table, indent=2).encode())
    atomic_write(os.path.join(workdir, TABLE_MD), table_md(rows).encode())
    plot(rows, os.path.join(workdir, PLOT))
    return table


def plot(rows: list[dict], path: str) -> None:
    """Accuracy vs pairs: one panel per (seq_len, width), one line per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["seq_len"], r["width"]) for r in rows})
    if not panels:
        return  # nothing finished yet
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.5), squeeze=False)
    for ax, (t, w) in zip(axes[0], panels, strict=True):
        for model in dict.fromkeys(r["model"] for r in rows):
            pts = sorted((r["pairs"], r["acc"]) for r in rows
                         if r["model"] == model and (r["seq_len"], r["width"]) == (t, w))  # fmt: skip
            ax.plot(*zip(*pts, strict=True), marker="o", label=model)
        ax.set(title=f"T = {t}, width {w}", xlabel="key-value pairs", ylabel="accuracy",
               ylim=(0, 1.02))  # fmt: skip
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------ CLI
_CONFIG = config_flags.DEFINE_config_file("config", None, "experiments/configs/recall_sweep.py")
_WORKDIR = flags.DEFINE_string("workdir", None, "Sweep directory (one subdirectory per run).")


def _body():
    if _CONFIG.value is None or not _WORKDIR.value:
        raise ValueError("--config and --workdir are required")
    table = recall_sweep(_CONFIG.value, _WORKDIR.value, log=lambda s: print(s, flush=True))
    print(table_md(table["rows"]), end="")
    print(f"wrote {os.path.join(_WORKDIR.value, TABLE_MD)} ({table['wall_s']} s)")


main, run = cli.absl_entry(_body, "recall_sweep")

if __name__ == "__main__":
    run()
