"""The suite's cells (task x family), resumable: each finished cell is one JSON file.

A cell trains every (learning rate, seed) run of one family on one task (`runner`), picks
the rate with the best mean validation accuracy over seeds and records, for that rate, the
test accuracy of every seed (and, for state tracking, the accuracy at each test length).
`<workdir>/cells/<task>__<family>.json` is written atomically when the cell ends; a rerun
reads it back instead of training, after checking it was made with the same settings.
"""

import json
import os
import time

import numpy as np

from experiments.synthetic import families, runner
from gpn_jax.checkpoints import lock as workdir_lock
from gpn_jax.data import synthetic
from gpn_jax.data.synthetic import state
from gpn_jax.io import untrusted
from gpn_jax.io.files import atomic_write

CELLS = "cells"
LEAK_MARGIN = 0.1  # a state task's two-token lookup may beat chance by sampling noise only


def task_list(c) -> list[str]:
    names = list(c.tasks.keys())
    unknown = [n for n in names if n not in synthetic.TASKS]
    if unknown:
        raise ValueError(
            f"unknown tasks {unknown} in the config; choose from {sorted(synthetic.TASKS)}"
        )
    return names


def task_examples(c, name: str, split: str, n: int, seq_len: int | None = None):
    t = c.tasks[name]
    params = dict(t.get("params", {}))
    return synthetic.generate(name, n, seq_len or t.seq_len, t.vocab, c.data_seed, split, **params)


def example_len(c, name: str) -> int:
    return task_examples(c, name, "valid", 1).inputs.shape[1]


def task_window(c, name: str) -> int:
    """The training window of one task: `c.window` for every task when set (one compiled
    step per family), else the task's own example length (one per family and task shape)."""
    return c.window or example_len(c, name)


def shapes(c) -> tuple[int, int]:
    """(model vocab, longest window): shared by every task of the suite."""
    vocab = runner.RESERVED + max(t.vocab for t in c.tasks.values())
    windows = [task_window(c, n) for n in task_list(c)]
    longest = max(windows + [L for t in c.tasks.values() for L in t.get("test_lens", ())])
    return vocab, longest


def settings(c, task: str, family: str, fields: dict) -> dict:
    """What a cell's result depends on (a finished cell is reused only if these match)."""
    t = c.tasks[task].to_dict()
    keys = ("learning_rates", "seeds", "steps", "batch_size", "warmup_frac", "weight_decay",
            "clip", "n_valid", "n_test", "data_seed")  # fmt: skip
    hyper = {k: (list(v) if isinstance(v, tuple) else v) for k in keys for v in [c[k]]}
    hyper["window"] = task_window(c, task)
    return json.loads(json.dumps({"task": t, "model": fields, **hyper}))


def cell_path(workdir: str, task: str, family: str) -> str:
    return os.path.join(workdir, CELLS, f"{task}__{family}.json")


def read_cell(path: str, want: dict) -> dict | None:
    """The finished cell at `path`, or None; a cell made with other settings is an error."""
    if not os.path.exists(path):
        return None
    fix = "delete it (or use a fresh --workdir) to retrain this cell"
    cell = untrusted.read_json(path, fix=fix)
    if not isinstance(cell, dict) or cell.get("settings") != want:
        raise ValueError(f"{path}: made with other settings than this config; {fix}")
    return {k: v for k, v in cell.items() if k != "settings"}


def leak_check(c, name: str) -> float | None:
    """The best two-token lookup's held-out accuracy on a state task (None otherwise); a
    format that lets it beat chance by more than LEAK_MARGIN stops the suite."""
    if name not in synthetic.STATE_TASKS:
        return None
    fit = task_examples(c, name, "train", 2000)
    held = task_examples(c, name, "valid", 500)
    leak = state.leak_score(fit, held)
    ch = synthetic.chance(name, c.tasks[name].vocab, {})
    if leak > ch + LEAK_MARGIN:
        raise ValueError(
            f"task {name}: the last two inputs predict the label with accuracy {leak:.3f} "
            f"(chance {ch:.3f}); the format leaks the state into the input stream"
        )
    return leak


def run_cell(c, task: str, family: str, fields: dict, window: int, log) -> dict:
    """Trains and scores one cell; returns its result (see the module docstring)."""
    start = time.time()
    prog = runner.programs(tuple(sorted(fields.items())), c.weight_decay, c.clip)
    t = c.tasks[task]
    leak = leak_check(c, task)
    train_ex = task_examples(c, task, "train", t.n_train)
    params, losses, first = runner.train(prog, train_ex, c, window, log)
    acc = lambda ex, w: runner.accuracy(prog, params, ex, w, c.eval_batch)
    valid = acc(task_examples(c, task, "valid", c.n_valid), window)
    test = acc(task_examples(c, task, "test", c.n_test), window)
    n_seeds = len(c.seeds)
    by_lr = valid.reshape(len(c.learning_rates), n_seeds)
    best = int(np.argmax(by_lr.mean(1)))
    pick = slice(best * n_seeds, (best + 1) * n_seeds)
    lengths = {}
    for L in t.get("test_lens", ()):
        ex = task_examples(c, task, "test", c.n_test, seq_len=L)
        lengths[str(L)] = acc(ex, max(window, L)).reshape(-1, n_seeds)[best].tolist()
    return {
        "task": task, "family": family, "model": families.NAMES[family],
        "params": families.n_params(fields), "best_lr": c.learning_rates[best],
        "valid_acc_by_lr": {f"{lr:g}": v.tolist() for lr, v in zip(c.learning_rates, by_lr, strict=True)},
        "test_acc": test[pick].tolist(), "test_acc_mean": float(test[pick].mean()),
        "test_acc_std": float(test[pick].std(ddof=1)) if n_seeds > 1 else 0.0,
        "final_loss": losses[pick].tolist(), "length_acc": lengths,
        "chance": synthetic.chance(task, t.vocab, dict(t.get("params", {}))),
        "leak_score": leak, "wall_s": round(time.time() - start, 1),
        "first_step_s": round(first, 1),
    }  # fmt: skip


def run_suite(c, workdir: str, log=print) -> list[dict]:
    """Every cell of the config, finished ones read back; returns the cells in plan order.
    One suite per workdir: a second is refused (the trainers' workdir lock)."""
    os.makedirs(os.path.join(workdir, CELLS), exist_ok=True)
    held = workdir_lock.acquire(workdir)
    try:
        return _run_cells(c, workdir, log)
    finally:
        held.release()


def _run_cells(c, workdir: str, log) -> list[dict]:
    names, fams = task_list(c), families.family_list(c.families)
    vocab, longest = shapes(c)
    fields = {f: families.model_fields(f, c, vocab, longest + 1) for f in fams}
    plan = [(t, f) for f in fams for t in names]  # family-major: compiled steps are reused
    cells = []
    for i, (task, fam) in enumerate(plan, 1):
        path, want = cell_path(workdir, task, fam), settings(c, task, fam, fields[fam])
        cell = read_cell(path, want)
        tag = f"[{i}/{len(plan)}] {task} x {families.NAMES[fam]}"
        if cell is None:
            log(f"{tag}: training {len(c.learning_rates)} lrs x {len(c.seeds)} seeds")
            cell = run_cell(
                c, task, fam, fields[fam], want["window"],
                lambda s, tag=tag: log(f"{tag}: {s}"),
            )  # fmt: skip
            atomic_write(path, json.dumps(cell | {"settings": want}, indent=1).encode())
        log(f"{tag}: test acc {cell['test_acc_mean']:.3f} ± {cell['test_acc_std']:.3f} "
            f"(lr {cell['best_lr']:g}, {cell['wall_s']} s)")  # fmt: skip
        cells.append(cell)
    return cells
