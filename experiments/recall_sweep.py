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

Two ways to train the grid faster on 2 CPU cores were tried and measured (2026-12-01, 2-core
AVX2 machine) and not kept: training the learning-rate x seed runs of a cell as one
`jax.vmap`-ed program cost 0.8-1.7x per run what one run's step costs (XLA:CPU runs the
batched matmuls off its fast path), and two runs side by side in single-threaded processes
took 190 s where one after the other took 218 s (GPN+M and Gated DeltaNet, 2 seeds each, 600
steps): XLA already spreads one of these steps over both cores.

`--config.report_only=True` only tabulates the finished runs (a partial grid; rows list the
seeds they hold), so several processes can share the grid (e.g. one per `--config.families`
subset) and one more call writes the joint table. Outputs in the workdir: `recall_table.md`, `recall_table.json` and `recall_vs_pairs.png`
(accuracy vs number of pairs, one line per family, one panel per (seq_len, width)).
"""

import json
import os
import time

from absl import flags
from ml_collections import config_flags

from gpn_jax import cli
from gpn_jax.configs import common
from gpn_jax.eval.recall import recall_eval
from gpn_jax.io.files import atomic_write
from gpn_jax.models import accounting, factory
from gpn_jax.training.loop import train_and_evaluate
from gpn_jax.training.restore import load_run

RESULT, TABLE_MD, TABLE_JSON, PLOT = (
    "recall_result.json",
    "recall_table.md",
    "recall_table.json",
    "recall_vs_pairs.png",
)
NAMES = {"gpn_m": "GPN+M", "gpn": "GPN", "gdn": "Gated DeltaNet", "transformer": "Transformer++"}


# ------------------------------------------------------------------------------ models
def base_fields(family: str, width: int, vocab: int, seq_len: int, sweep) -> dict:
    """The family's model block at `width` before parameter matching (GPN+M's d_ffn is
    `ffn_mult` x width, rounded to a multiple of 8; the others' are matched to its count)."""
    w, h = width, sweep.heads
    ffn = max(8, round(sweep.ffn_mult * w / 8) * 8)
    gpn_m = dict(family="gpn", vocab_size=vocab, d_model=w, d_emb=w // 2, d_ffn=ffn,
                 n_heads=h, d_key=max(w // (2 * h), 1), d_value=max(w // h, 1), loss_chunk=32)  # fmt: skip
    if family == "gpn_m":
        return gpn_m
    if family == "gpn":
        return gpn_m | dict(memory=False, n_heads=0, d_key=0, d_value=0)
    if family == "gdn":
        return dict(family="gdn", vocab_size=vocab, d_model=w, n_layers=sweep.gdn_layers,
                    n_heads=2, d_key=max(w // 4, 1), d_value=max(w // 2, 1), d_ffn=2 * w,
                    chunk_size=min(64, seq_len), loss_chunk=32)  # fmt: skip
    if family == "transformer":
        return dict(family="transformer", vocab_size=vocab, d_model=w,
                    n_layers=sweep.transformer_layers, n_heads=2, d_ffn=2 * w,
                    max_seq_len=seq_len, loss_chunk=32)  # fmt: skip
    raise ValueError(f"unknown family {family!r}; choose from {','.join(NAMES)}")


def n_params(fields: dict) -> int:
    return accounting.param_counts(factory.build_model(fields))["total"]


def match_ffn(fields: dict, target: int) -> dict:
    """`fields` with the d_ffn (a multiple of 8) whose parameter count is nearest `target`
    (the count is linear in d_ffn)."""
    a, b = n_params(fields | dict(d_ffn=8)), n_params(fields | dict(d_ffn=16))
    per = (b - a) / 8
    ffn = max(8, round((8 + (target - a) / per) / 8) * 8)
    return fields | dict(d_ffn=int(ffn))


def model_fields(family: str, width: int, seq_len: int, sweep) -> dict:
    vocab = 3 + 2 * sweep.n_keys
    fields = base_fields(family, width, vocab, seq_len, sweep)
    if family != "gpn_m":
        fields = match_ffn(fields, n_params(base_fields("gpn_m", width, vocab, seq_len, sweep)))
    return fields


def run_config(sweep, fields: dict, pairs: int, seq_len: int, lr: float, seed: int):
    """A training config for one run: fresh answer-only MQAR examples, the sweep's recipe."""
    c = common.base_config()
    c.seed = seed
    c.model = common.model_block(fields)
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
    path = os.path.join(workdir, RESULT)
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    start = time.time()
    train_and_evaluate(config, workdir)
    r = recall_eval(load_run(workdir), heldout)
    result = {
        "acc": r["acc"],
        "acc_by_query": r["acc_by_query"],
        "chance": r["chance"],
        "params": n_params(config.model.to_dict()),
        "wall_s": round(time.time() - start, 1),
    }
    atomic_write(path, json.dumps(result, indent=2).encode())
    return result


def cells(sweep):
    return [(p, t, w) for p in sweep.pairs for t in sweep.seq_lens for w in sweep.widths]


def families(sweep) -> list[str]:
    names = [n.strip() for n in sweep.families.split(",") if n.strip()]
    unknown = [n for n in names if n not in NAMES]
    if unknown or not names:
        raise ValueError(f"unknown families {unknown or names}; choose from {','.join(NAMES)}")
    return names


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


def sweep_cell(sweep, workdir: str, cell, family: str, log) -> dict:
    """Every (lr, seed) run of one family in one cell; the best learning rate's row (None when
    `report_only` finds no finished run)."""
    pairs, seq_len, width = cell
    fields = model_fields(family, width, seq_len, sweep)
    by_lr = {}
    for lr in sweep.learning_rates:
        accs = []
        for seed in sweep.seeds:
            wd = os.path.join(workdir, f"p{pairs}_t{seq_len}_w{width}", family, f"lr{lr:g}_s{seed}")
            if sweep.get("report_only") and not os.path.exists(os.path.join(wd, RESULT)):
                continue  # tabulate finished runs only
            r = train_one(run_config(sweep, fields, pairs, seq_len, lr, seed), wd, sweep.heldout)
            log(f"pairs={pairs} T={seq_len} width={width} {family} lr={lr:g} seed={seed}: "
                f"acc {r['acc']:.4f} ({r['wall_s']} s)")  # fmt: skip
            accs.append(r["acc"])
        if accs:
            by_lr[lr] = accs
    if not by_lr:
        return None
    best = max(by_lr, key=lambda lr: sum(by_lr[lr]) / len(by_lr[lr]))
    accs = by_lr[best]
    return {
        "pairs": pairs, "seq_len": seq_len, "width": width, "family": family,
        "model": NAMES[family], "params": n_params(fields), "best_lr": best,
        "acc": sum(accs) / len(accs), "acc_by_seed": accs, "chance": 1.0 / sweep.n_keys,
        "acc_by_lr": {f"{lr:g}": v for lr, v in by_lr.items()},
    }  # fmt: skip


def recall_sweep(sweep, workdir: str, log=print) -> dict:
    """Runs the whole grid; writes and returns the table ({'rows': [...], 'config': ...})."""
    names = families(sweep)
    check_cells(sweep)
    os.makedirs(workdir, exist_ok=True)
    start, rows = time.time(), []
    for cell in cells(sweep):
        for family in names:
            row = sweep_cell(sweep, workdir, cell, family, log)
            if row is not None:
                rows.append(row)
                write_outputs(workdir, rows, sweep, time.time() - start)  # partial tables too
    return write_outputs(workdir, rows, sweep, time.time() - start)


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
