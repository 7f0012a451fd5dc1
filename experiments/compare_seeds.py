"""Seeds and the overfitting check of `experiments.compare`: run dirs, mean ± std, train PPL.

With `--seeds=N` (or `compare.seeds`) every model trains N times, seed `seed + k` for k < N
(initialisation and training-window order both follow the seed), in `<workdir>/<name>/s<k>`;
N = 1 keeps the single-run layout `<workdir>/<name>`. The table reports the mean and the sample
standard deviation (ddof = 1) over the seeds.

Train PPL at the end: the final parameters scored exactly like held-out PPL (`windows_ppl`, every
window from the zero state) on as many training tokens as the held-out split has, in windows
drawn uniformly from the whole training split (a fixed shuffle, TRAIN_EVAL_SEED, so every model
and seed scores the same windows; the first windows in file order would be one corner of the
corpus). Under one epoch only part of those windows were trained on. The gap is held-out PPL /
train PPL - 1; a model is flagged when |gap| > 5 % (the no-overfit condition of a ranking
table). Part of any gap is the held-out documents being easier or harder than the training
split, not overfitting: the same comparison for the add-one unigram model of the training split
(`unigram_gap`, over the same tokens, no learning involved) shows that part.
"""

import itertools
import json
import math
import os

import numpy as np

GAP_LIMIT = 0.05
TRAIN_PPL_CACHE = "compare_train_ppl.json"
TRAIN_EVAL_SEED = 20_261_130  # the train-PPL windows' shuffle (not a training seed)


def seed_count(config, flag: int | None = None) -> int:
    """The runs per model: the flag if given, else `compare.seeds` (default 1)."""
    n = flag if flag is not None else config.compare.get("seeds", 1)
    if n < 1:
        raise ValueError(f"--seeds must be >= 1, got {n}")
    return int(n)


def run_dir(workdir: str, name: str, k: int, seeds: int) -> str:
    return os.path.join(workdir, name) if seeds == 1 else os.path.join(workdir, name, f"s{k}")


def mean_std(values) -> tuple[float | None, float | None]:
    """(mean, sample std with ddof = 1) of the non-None values; std None below two values."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None, None
    mean = math.fsum(xs) / len(xs)
    if len(xs) < 2:
        return mean, None
    return mean, math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1))


def overfit_gap(heldout_ppl: float | None, train_ppl: float | None) -> float | None:
    """Held-out PPL / train PPL - 1 (> 0: the model does better on its training split)."""
    if heldout_ppl is None or not train_ppl:
        return None
    return heldout_ppl / train_ppl - 1


def train_ppl(run_path: str, heldout_tokens: int) -> dict:
    """Train PPL of a finished run (module doc), cached per checkpoint step in the run dir."""
    from gpn_jax.checkpoints.restore import load_run
    from gpn_jax.data.windows import WindowIterator
    from gpn_jax.eval.ppl import windows_ppl
    from gpn_jax.training.loop import unigram_ppl

    run = load_run(run_path)
    cache = os.path.join(run_path, TRAIN_PPL_CACHE)
    if os.path.exists(cache):
        with open(cache) as f:
            saved = json.load(f)
        if saved.get("step") == int(run.step) and "train_unigram_ppl" in saved:
            return saved
    data = run.data()
    t = run.config.train
    per_batch = t.batch_size * t.seq_len
    windows = WindowIterator(
        data.train_tokens, t.batch_size, t.seq_len, seed=TRAIN_EVAL_SEED, repeat=False,
        process_index=data.process_index, process_count=data.process_count, name="train-eval",
    )  # fmt: skip
    batches = list(itertools.islice(windows, max(1, heldout_tokens // per_batch)))
    res = windows_ppl(run.model, run.params, batches)
    out = {
        "step": int(run.step),
        "train_ppl": res["ppl"],
        "train_eval_tokens": res["tokens"],
        "train_unigram_ppl": unigram_ppl(data.unigram_counts, np.concatenate(batches)),
    }
    with open(cache, "w") as f:
        json.dump(out, f, indent=2)
    return out


def aggregate(row: dict) -> dict:
    """The row's table numbers from its per-seed `runs`: mean ± std of held-out and train PPL
    and of the gap, and the largest |gap| (the one the no-overfit check reads)."""
    runs = row["runs"]
    out = {}
    for key in ("heldout_ppl", "train_ppl", "gap", "unigram_gap"):
        out[key], out[key + "_std"] = mean_std(r.get(key) for r in runs)
    gaps = [r["gap"] for r in runs if r.get("gap") is not None]
    out["max_abs_gap"] = max((abs(g) for g in gaps), default=None)
    out["seeds"] = [r["seed"] for r in runs]
    return out


def gap_warnings(rows: list[dict], limit: float = GAP_LIMIT) -> list[str]:
    """One line per model whose |held-out / train PPL - 1| exceeds `limit` in any seed."""
    lines = []
    for r in rows:
        if r.get("max_abs_gap") is not None and r["max_abs_gap"] > limit:
            worst = max((x for x in r["runs"] if x.get("gap") is not None),
                        key=lambda x: abs(x["gap"]))  # fmt: skip
            side = "overfits" if worst["gap"] > 0 else "scores worse on its training split"
            lines.append(
                f"WARNING: {r['label']} {side}: held-out PPL {worst['heldout_ppl']:.2f} vs train "
                f"PPL {worst['train_ppl']:.2f} (gap {worst['gap']:+.1%}, seed {worst['seed']}) "
                f"exceeds ±{limit:.0%}"
            )
    return lines


def pm(mean: float | None, std: float | None, spec: str = ".2f") -> str:
    """'mean ± std' ('—' if no mean; the mean alone for one seed)."""
    if mean is None:
        return "—"
    if std is None:
        return format(mean, spec)
    return f"{format(mean, spec)} ± {format(std, spec.lstrip('+'))}"  # a std has no sign
