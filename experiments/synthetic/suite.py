"""The suite's cells (task x family), resumable: each finished cell is one JSON file.

A cell trains every (learning rate, seed) run of one family on one task (`runner`), picks
the rate with the best mean validation accuracy over seeds and records, for that rate, the
test accuracy of every seed (and, for state tracking, the accuracy at each test length).
`<workdir>/cells/<task>__<family>.json` is written atomically when the cell ends; a rerun
reads it back instead of training, after checking it was made with the same settings.
"""

import functools
import json
import os
import time

import numpy as np

from experiments.synthetic import levels, runner
from gpn_jax.data import synthetic
from gpn_jax.data.synthetic import state
from gpn_jax.io import lock as workdir_lock
from gpn_jax.io import untrusted
from gpn_jax.io.files import atomic_write
from gpn_jax.models import factory
from gpn_jax.parallel import core_pool
from gpn_jax.training import host_memory

CELLS = "cells"
LEAK_MARGIN = 0.1  # a state task's two-token lookup may beat chance by sampling noise only


def task_kind(c, name: str) -> str:
    """The generator a config task runs: its `kind` (e.g. two MQAR settings, `mqar_4` and
    `mqar_8`, both of kind `mqar`), else its name."""
    return c.tasks[name].get("kind") or name


def task_list(c) -> list[str]:
    """The config's task names, each checked before any training: a known generator, and more
    than one answer symbol (a task whose chance is 1.0 tests nothing)."""
    names = list(c.tasks.keys())
    unknown = [n for n in names if task_kind(c, n) not in synthetic.TASKS]
    if unknown:
        raise ValueError(
            f"unknown tasks {unknown} in the config; choose from {sorted(synthetic.TASKS)}"
        )
    for n in names:
        t = c.tasks[n]
        try:
            synthetic.chance(task_kind(c, n), t.vocab, dict(t.get("params", {})))
        except ValueError as e:
            raise ValueError(f"config task {n}: {e}") from None
    return names


def _generate(c, name: str, split: str, n: int, seq_len: int, redraw: int = 0):
    """`redraw` > 0: the redraw-th fresh set (another seed) for replacing overlapping rows."""
    t = c.tasks[name]
    seed = c.data_seed + 7_919 * redraw
    return synthetic.generate(
        task_kind(c, name), n, seq_len, t.vocab, seed, split, **dict(t.get("params", {}))
    )


def _rows(ex) -> list[bytes]:
    return [r.tobytes() for r in np.asarray(ex.inputs)]


def task_examples(c, name: str, split: str, n: int, seq_len: int | None = None):
    """`n` examples of one split; validation and test examples that also occur in the
    training set (or, for test, in validation) are replaced by fresh draws, so the splits are
    disjoint. Memorisation is the exception: its test queries the map the training set wrote."""
    seq_len = seq_len or c.tasks[name].seq_len
    ex = _generate(c, name, split, n, seq_len)
    if split == "train" or task_kind(c, name) == "memorisation":
        return ex
    if seq_len != c.tasks[name].seq_len:  # a longer test length: no training example is as long
        return ex
    seen = set(_rows(_generate(c, name, "train", c.tasks[name].n_train, seq_len)))
    if split == "test":  # the validation split as its own call draws it, one training set read
        valid = _generate(c, name, "valid", c.n_valid, seq_len)
        seen |= set(_rows(_disjoint(c, name, "valid", valid, seen, seq_len)))
    return _disjoint(c, name, split, ex, seen, seq_len)


def _disjoint(c, name: str, split: str, ex, seen: set, seq_len: int, tries: int = 8):
    keep = np.array([r not in seen for r in _rows(ex)])
    for attempt in range(1, tries + 1):
        if keep.all():
            return ex
        fresh = _generate(c, name, split, len(keep), seq_len, attempt)
        fresh_ok = np.array([r not in seen for r in _rows(fresh)])
        take = np.flatnonzero(fresh_ok)[: int((~keep).sum())]
        slots = np.flatnonzero(~keep)[: len(take)]
        ex = type(ex)(*(np.asarray(a).copy() for a in ex))
        for a, b in zip(ex, fresh, strict=True):
            a[slots] = np.asarray(b)[take]
        keep[slots] = True
    raise ValueError(
        f"task {name}: too few distinct {seq_len}-token examples for disjoint train, "
        f"validation and test splits; raise its seq_len or vocab, or lower n_train"
    )


def example_len(c, name: str) -> int:
    return _generate(c, name, "valid", 1, c.tasks[name].seq_len).inputs.shape[1]


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
    hyper["eval_every"] = c.get("eval_every", 0)
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
    kind = task_kind(c, name)
    if kind not in synthetic.STATE_TASKS:
        return None
    fit = task_examples(c, name, "train", 2000)
    held = task_examples(c, name, "valid", 500)
    leak = state.leak_score(fit, held)
    ch = synthetic.chance(kind, c.tasks[name].vocab, {})
    if leak > ch + LEAK_MARGIN:
        raise ValueError(
            f"task {name}: the last two inputs predict the label with accuracy {leak:.3f} "
            f"(chance {ch:.3f}); the format leaks the state into the input stream"
        )
    return leak


def level(c, task: str, fields: dict, test_ex) -> float:
    """What the cell must beat at the training length (`levels`): guessing among the
    context's answers (recall, copying), the directly seen positions (state), else chance."""
    t, kind = c.tasks[task], task_kind(c, task)
    ch = synthetic.chance(kind, t.vocab, dict(t.get("params", {})))
    if kind in levels.CONTEXT_TASKS:
        return levels.context_guess(test_ex)
    if kind in synthetic.STATE_TASKS:
        return levels.state_level(ch, test_ex.inputs.shape[1], levels.direct_positions(fields))
    return ch


def _lengths(c, task: str, acc_at, n_seeds: int, best: int) -> tuple[dict, list, list]:
    """(accuracy per test length, accuracy past the training length, per-position accuracy)
    of the chosen rate's seeds; the last two on the longest test length."""
    t, lengths, beyond, positions = c.tasks[task], {}, [], []
    for L in t.get("test_lens", ()):
        correct, total = acc_at(task_examples(c, task, "test", c.n_test, seq_len=L), L)
        mine = correct.reshape(-1, n_seeds, L)[best]  # (seeds, L)
        lengths[str(L)] = (mine.sum(1) / total.sum()).tolist()
        if L == max(t.test_lens) and L > t.seq_len:
            beyond = (mine[:, t.seq_len :].sum(1) / total[t.seq_len :].sum()).tolist()
            positions = np.round(mine.mean(0) / np.maximum(total, 1), 4).tolist()
    return lengths, beyond, positions


def run_cell(c, task: str, family: str, fields: dict, window: int, log) -> dict:
    """Trains and scores one cell; returns its result (see the module docstring)."""
    start = time.time()
    prog = runner.programs(tuple(sorted(fields.items())), c.weight_decay, c.clip)
    t, kind, n_seeds = c.tasks[task], task_kind(c, task), len(c.seeds)
    leak = leak_check(c, task)
    train_ex = task_examples(c, task, "train", t.n_train)
    valid_ex = task_examples(c, task, "valid", c.n_valid)
    curve = []  # (step, every run's validation accuracy)
    on_eval = lambda step, p: curve.append(
        [step, np.round(runner.accuracy(prog, p, valid_ex, window, c.eval_batch), 4).tolist()]
    )
    params, losses, first = runner.train(prog, train_ex, c, window, log, on_eval)
    acc = lambda ex, w: runner.accuracy(prog, params, ex, w, c.eval_batch)
    valid = acc(valid_ex, window)
    test_ex = task_examples(c, task, "test", c.n_test)
    test = acc(test_ex, window)
    by_lr = valid.reshape(len(c.learning_rates), n_seeds)
    best = int(np.argmax(by_lr.mean(1)))
    pick = slice(best * n_seeds, (best + 1) * n_seeds)
    acc_at = lambda ex, L: runner.correct_by_position(
        prog, params, ex, max(window, L), c.eval_batch
    )
    lengths, beyond, positions = _lengths(c, task, acc_at, n_seeds, best)
    lvl = level(c, task, fields, test_ex)
    chance = synthetic.chance(kind, t.vocab, dict(t.get("params", {})))
    return {
        "task": task, "kind": kind, "family": family, "model": factory.label(family),
        "params": factory.n_params(fields), "best_lr": c.learning_rates[best],
        "valid_acc_by_lr": {f"{lr:g}": v.tolist() for lr, v in zip(c.learning_rates, by_lr, strict=True)},
        "test_acc": test[pick].tolist(), "test_acc_mean": float(test[pick].mean()),
        "test_acc_std": float(test[pick].std(ddof=1)) if n_seeds > 1 else 0.0,
        "final_loss": losses[pick].tolist(), "length_acc": lengths,
        "chance": chance, "level": lvl, "beyond_acc": beyond,
        "position_acc": positions, "valid_curve": curve,
        "leak_score": leak, "wall_s": round(time.time() - start, 1),
        "first_step_s": round(first, 1),
    }  # fmt: skip


def _cell_task(job: tuple) -> dict:
    """One cell, here or in a worker process (`core_pool`): trains it unless its file holds
    it, writes the file, returns the cell."""
    c, workdir, task, fam, fields, want, tag = job
    path = cell_path(workdir, task, fam)
    cell = read_cell(path, want)
    if cell is None:
        log = lambda s: print(f"{tag}: {s}", flush=True)
        log(f"training {len(c.learning_rates)} lrs x {len(c.seeds)} seeds")
        cell = run_cell(c, task, fam, fields, want["window"], log)
        atomic_write(path, json.dumps(cell | {"settings": want}, indent=1).encode())
    return cell


def worker_setup(cache_dir: str) -> None:
    """A worker's setup before it trains: freed buffers stay in its heap, and compiles go
    through one persistent cache the workers share (unless the user set their own)."""
    import jax

    host_memory.reuse_freed_heap()
    if not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def model_block(key: str, c, vocab: int, max_len: int) -> dict:
    """Model `key`'s block at the suite's width, matched to GPN+M's parameter count."""
    size = factory.Width(c.width, vocab, max_len, c.heads, c.ffn_mult, c.gdn_layers,
                         c.transformer_layers, c.gdn_chunk, loss_chunk=64)  # fmt: skip
    return factory.matched(key, size)


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
    names, fams = task_list(c), factory.variant_keys(c.families)
    vocab, longest = shapes(c)
    fields = {f: model_block(f, c, vocab, longest + 1) for f in fams}
    plan = [(t, f) for f in fams for t in names]  # family-major: compiled steps are reused
    jobs = []
    for i, (task, fam) in enumerate(plan, 1):
        want = settings(c, task, fam, fields[fam])
        tag = f"[{i}/{len(plan)}] {task} x {factory.label(fam)}"
        jobs.append((c, workdir, task, fam, fields[fam], want, tag))
    workers = core_pool.auto_workers(c.get("workers", 1))
    setup = functools.partial(worker_setup, os.path.join(workdir, "compile_cache"))
    cells = [None] * len(plan)
    for i, cell in core_pool.map_unordered(_cell_task, jobs, workers, worker_setup=setup):
        log(f"{jobs[i][-1]}: test acc {cell['test_acc_mean']:.3f} ± {cell['test_acc_std']:.3f} "
            f"(lr {cell['best_lr']:g}, {cell['wall_s']} s)")  # fmt: skip
        cells[i] = cell
    return cells
