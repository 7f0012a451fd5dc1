"""The suite's outputs: the result file (renderer format), its Markdown table, the
length-generalisation plot and the benchmark record (wall time per cell)."""

import json
import os
import platform
import sys

from experiments.synthetic import verdicts
from gpn_jax.io.files import atomic_write
from gpn_jax.io.provenance import package_version
from gpn_jax.models import factory

COLUMNS = ("gpn_m", "gpn", "transformer", "gdn", "gdn_neg")


def _acc(cell: dict | None) -> str:
    if cell is None:
        return "–"
    return f"{cell['test_acc_mean']:.3f} ± {cell['test_acc_std']:.3f} ({cell['best_lr']:g})"


def task_rows(c, cells: list[dict]) -> list[dict]:
    """One row per task: its protocol and, per family, test accuracy mean ± sd over seeds at
    the learning rate chosen on validation (in parentheses)."""
    by = {(x["task"], x["family"]): x for x in cells}
    rows = []
    for name, t in c.tasks.items():
        ch = next((x["chance"] for x in cells if x["task"] == name), None)
        params = ", ".join(f"{k}={v}" for k, v in dict(t.get("params", {})).items())
        row = {"task": name, "seq_len": t.seq_len, "vocab": t.vocab, "n_train": t.n_train,
               "setting": params or "–", "chance": "–" if ch is None else f"{ch:.3f}"}  # fmt: skip
        row |= {f: _acc(by.get((name, f))) for f in COLUMNS}
        rows.append(row)
    return rows


def params_row(cells: list[dict]) -> dict:
    return {f: next((x["params"] for x in cells if x["family"] == f), None) for f in COLUMNS}


def record(c, cells: list[dict], wall_s: float, command: str) -> dict:
    """The result file: renderer header fields, task rows and every cell in full."""
    out = record_header(command) | {
        "wall_s": round(wall_s, 1),  # this invocation (a resumed run reads finished cells back)
        "cells_wall_s": round(sum(x["wall_s"] for x in cells), 1),  # every cell's training
        "params": params_row(cells),
        "rows": task_rows(c, cells),
    }
    if verdicts.has_levels(cells):  # cells that carry their levels: the verdict tables
        marked = verdicts.annotate(c, cells)
        out |= {"level_rows": verdicts.level_rows(marked),
                "onset_rows": verdicts.onset_rows(marked, c.steps),
                "published": verdicts.published_rows(marked)}  # fmt: skip
        cells = [verdicts.judge(x) for x in cells]
    return out | {"cells": cells}


def bench(cells: list[dict], wall_s: float, command: str) -> dict:
    """The suite's speed: per family, its cells' total wall time and the first cell's (which
    includes the compile the later cells reuse); `cells`: the wall time of every cell."""
    rows = []
    for fam in dict.fromkeys(x["family"] for x in cells):
        mine = [x for x in cells if x["family"] == fam]
        rows.append({"model": mine[0]["model"], "cells": len(mine),
                     "wall_s": round(sum(x["wall_s"] for x in mine), 1),
                     "first_cell_s": mine[0]["wall_s"],
                     "first_step_s": mine[0]["first_step_s"]})  # fmt: skip
    per_cell = [{"task": x["task"], "model": x["model"], "wall_s": x["wall_s"],
                 "first_step_s": x["first_step_s"]} for x in cells]  # fmt: skip
    total = round(sum(x["wall_s"] for x in cells), 1)
    return record_header(command) | {
        "wall_s": round(wall_s, 1), "cells_wall_s": total, "rows": rows, "cells": per_cell
    }  # fmt: skip


def record_header(command: str) -> dict:
    from datetime import date

    return {"command": command, "date": date.today().isoformat(),
            "machine": f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs",
            "version": f"gpn_jax {package_version()}"}  # fmt: skip


def table_md(rows: list[dict]) -> str:
    head = ["Task", "T", "Vocab", "Train", "Setting", "Chance"]
    head += [factory.label(f) for f in COLUMNS]
    keys = ["task", "seq_len", "vocab", "n_train", "setting", "chance", *COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plot_lengths(cells: list[dict], path: str) -> bool:
    """Accuracy vs test length for the state tasks, one panel per task, one line per family
    (mean over seeds, bars: sd). False when no cell has length results yet."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    tasks = list(dict.fromkeys(x["task"] for x in cells if x["length_acc"]))
    if not tasks:
        return False
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        for x in (x for x in cells if x["task"] == task):
            L = sorted(int(k) for k in x["length_acc"])
            accs = [np.asarray(x["length_acc"][str(n)]) for n in L]
            sd = [a.std(ddof=1) if len(a) > 1 else 0.0 for a in accs]  # as the table's
            ax.errorbar(L, [a.mean() for a in accs], yerr=sd,
                        marker="o", capsize=2, label=x["model"])  # fmt: skip
        if cells and (ch := next(x["chance"] for x in cells if x["task"] == task)):
            ax.axhline(ch, color="grey", ls=":", lw=1, label="chance")
        ax.set(title=task, xlabel="test length (trained on the first)", ylabel="accuracy",
               ylim=(0, 1.02))  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xticks(L, [str(n) for n in L])
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _figure(n: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(n, 4)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.6 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    return plt, fig, list(axes.flat[:n])


def plot_positions(cells: list[dict], path: str) -> bool:
    """Accuracy at each position of the longest test length, state tasks: one panel per task,
    one line per family (mean over seeds); the training length marked. False when no cell
    has per-position results."""
    tasks = list(dict.fromkeys(x["task"] for x in cells if x.get("position_acc")))
    if not tasks:
        return False
    plt, fig, axes = _figure(len(tasks))
    for ax, task in zip(axes, tasks, strict=True):
        mine = [x for x in cells if x["task"] == task and x.get("position_acc")]
        for x in mine:
            ax.plot(range(1, len(x["position_acc"]) + 1), x["position_acc"], lw=1, label=x["model"])
        trained = min(int(k) for k in mine[0]["length_acc"])
        ax.axvline(trained, color="black", ls="--", lw=0.8, label=f"trained on {trained}")
        ax.axhline(mine[0]["chance"], color="grey", ls=":", lw=1, label="chance")
        ax.set(title=task, xlabel="position", ylabel="accuracy (mean over seeds)", ylim=(0, 1.02))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_curves(cells: list[dict], tasks, path: str) -> bool:
    """Validation accuracy during training (mean over the chosen rate's seeds), one panel per
    task, one line per family, the level to clear dotted. False without curves."""
    names = list(dict.fromkeys(x["task"] for x in cells if x.get("valid_curve")))
    if not names:
        return False
    plt, fig, axes = _figure(len(names))
    for ax, task in zip(axes, names, strict=True):
        for x in (x for x in cells if x["task"] == task):
            lr = list(x["valid_acc_by_lr"]).index(f"{x['best_lr']:g}")
            n = len(x["test_acc"])
            steps = [s for s, _ in x["valid_curve"]]
            accs = [sum(a[lr * n : (lr + 1) * n]) / n for _, a in x["valid_curve"]]
            ax.plot(steps, accs, lw=1, label=x["model"])
        if "level" in x:
            ax.axhline(x["level"], color="grey", ls=":", lw=1, label="level without it")
        ax.set(title=f"{task} (T = {tasks[task].seq_len})", xlabel="step",
               ylabel="validation accuracy", ylim=(0, 1.02))  # fmt: skip
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_all(c, workdir: str, cells: list[dict], wall_s: float) -> dict:
    """Writes <workdir>/<name>.json, <name>.md, <name>_length.png and <name>_bench.json."""
    command = "python -m experiments.synthetic " + " ".join(sys.argv[1:])
    out = record(c, cells, wall_s, command)
    stem = os.path.join(workdir, c.name)
    atomic_write(stem + ".json", json.dumps(out, indent=1).encode())
    atomic_write(stem + ".md", table_md(out["rows"]).encode())
    atomic_write(stem + "_bench.json", json.dumps(bench(cells, wall_s, command), indent=1).encode())
    plot_lengths(cells, stem + "_length.png")
    plot_positions(cells, stem + "_positions.png")
    plot_curves(cells, c.tasks, stem + "_curves.png")
    return out
