"""One command trains and compares GPN+M, GPN, Transformer++ and Gated DeltaNet.

    python -m experiments.compare --config=experiments/configs/compare_tiny.py --workdir=/tmp/cmp \
        [--seeds=3] [--lambada_path=lambada_test.jsonl] [--tasks=wikitext,lambada_openai,piqa,\
        hellaswag,winogrande,arc_easy,arc_challenge [--include_path=DIR]]

A compare config (`experiments/configs/compare_*.py`) holds the shared blocks of a training
config (`seed`, `data`, `train`, `mesh`), a dict `models` of model blocks and a `compare` block.
Every model's run config is the shared blocks plus its own model block, so all four train with
the same budget (steps, batch, seq_len, tokens, optimiser recipe) on the same data with one
tokenizer (obtained once: `data.tokenizer_path`, else trained into `<workdir>/tokenizer.model`),
and are evaluated identically (held-out PPL over the same held-out windows; LAMBADA with the
same file and protocol when `--lambada_path` is given).

`--seeds=N` (or `compare.seeds`) trains each model N times (seeds seed..seed+N-1, in
`<workdir>/<name>/s<k>`) and the table gives mean ± std (`experiments.compare_seeds`); every run
also reports train PPL and the held-out / train gap, with a warning above 5 %. With
`compare.analyze` the GPN / GPN+M runs are analysed (`gpn_jax.analysis`) and the paper's
qualitative claims are reported under the table (`experiments.compare_claims`).

Each model trains in `<workdir>/<name>` with `gpn_jax.training.loop.train_and_evaluate`; a
rerun reuses a finished run (its `final_metrics.json`) and resumes an unfinished one. Outputs in
the workdir: `comparison.md` and `comparison.json` (a table shaped like the paper's Table 1) and
`loss_curves.png` (training loss vs step / tokens).

`--tasks` adds the Gated DeltaNet paper's lm-evaluation-harness table for every model
(`experiments.harness_table`): the columns whose task data is on this machine are filled, the
others are named with the reason (e.g. "task 'piqa' not available offline").

From Python: `compare(config, workdir, lambada_path=None, tasks=None, include_path=None) ->
dict` (the `comparison.json`).
"""

import json
import os
import time

import jax
import ml_collections
from absl import flags
from ml_collections import config_flags

from experiments import compare_claims, compare_report, compare_seeds
from experiments import harness_table as paper_table
from gpn_jax.data.pipeline import TOKENIZER_FILE, resolve_tokenizer
from gpn_jax.data.sources import load_documents
from gpn_jax.data.spec import parse_spec
from gpn_jax.data.split import split_documents
from gpn_jax.io import cli
from gpn_jax.models import accounting, factory
from gpn_jax.parallel import distributed
from gpn_jax.training import host_memory
from gpn_jax.training.loop import FINAL_METRICS, prepare_workdir, train_and_evaluate

RUN_CONFIG = "compare_run_config.json"  # the run config a model's subdirectory was trained with
LAMBADA_CACHE = "compare_lambada.json"
TABLE_MD, TABLE_JSON, PLOT = "comparison.md", "comparison.json", "loss_curves.png"
COLUMNS = compare_report.COLUMNS  # the table's columns
_SHARED_EXCLUDED = ("models", "compare")


# ------------------------------------------------------------------------------ configs
def model_names(config) -> list[str]:
    """The models to run, in table order (`compare.models`, a comma-separated list)."""
    names = [n.strip() for n in config.compare.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in config.models]
    if unknown or not names:
        raise ValueError(
            f"compare.models names {unknown or 'nothing'}; choose from {sorted(config.models)}"
        )
    return list(dict.fromkeys(names))


def label(config, name: str) -> str:
    labels = config.compare.get("labels") or {}
    return labels.get(name, name)


def run_config(
    config, name: str, tokenizer_path: str = "", seed: int | None = None
) -> ml_collections.ConfigDict:
    """The full training config of model `name`: a copy of the shared blocks + its model block
    (with `seed` replacing the shared seed when given)."""
    shared = {k: v for k, v in config.to_dict().items() if k not in _SHARED_EXCLUDED}
    c = ml_collections.ConfigDict(shared)
    if seed is not None:
        c.seed = seed
    c.model = ml_collections.ConfigDict(config.models[name].to_dict())
    if "max_seq_len" in c.model:  # the Transformer's window is the shared training window
        c.model.max_seq_len = c.train.seq_len
    if tokenizer_path:
        c.data.tokenizer_path = tokenizer_path
    return c


def check_shared(config) -> int:
    """One vocabulary for all models (they share the tokenizer); returns it."""
    vocabs = {n: config.models[n].vocab_size for n in model_names(config)}
    if len(set(vocabs.values())) != 1:
        raise ValueError(f"the models must share one vocab_size (one tokenizer), got {vocabs}")
    return next(iter(vocabs.values()))


def shared_tokenizer(config, workdir: str) -> str:
    """The one tokenizer every run uses: the given one, else `<workdir>/tokenizer.model`
    (trained once on the shared training split, exactly as a run would). '' for token data."""
    d = config.data
    if d.tokenizer_path:
        return os.path.abspath(os.path.expanduser(d.tokenizer_path))
    source = parse_spec(d.source)
    if source.kind in ("bin", "recall"):
        return ""  # already token ids; nothing to share
    path = os.path.join(workdir, TOKENIZER_FILE)
    if not os.path.exists(path):
        docs, _ = load_documents(
            source, data_dir=d.data_dir or None, text_field=d.text_field or None
        )
        train_docs, _ = split_documents(docs, d.heldout_fraction)
        resolve_tokenizer(train_docs, check_shared(config), None, workdir)
        print(f"Trained the shared tokenizer (vocab {check_shared(config)}) -> {path}")
    return path


# ------------------------------------------------------------------------------ model stats
def model_stats(model_cfg, seq_len: int) -> dict:
    """Params, layers, state width and memory / state size of a model block (no weights)."""
    model = factory.build_model(model_cfg)
    m = model.config
    family = factory.family_name(model_cfg)
    counts = accounting.param_counts(model)
    cells, kind, formula = m.state(seq_len)
    return {
        "family": family,
        "params": counts["total"],
        "param_groups": counts["groups"],
        "layers": m.n_layers,
        "state_dim": m.d_model,
        "memory_cells": cells,
        "state_kind": kind,
        "state_formula": formula,
        "train_flops_per_token": int(model.flops_per_token(seq_len)["train"]),
    }


def print_param_counts(rows: list[dict]) -> None:
    counts = [r["params"] for r in rows]
    print("Parameter counts:")
    for r in rows:
        print(f"  {r['label']:<16}{r['params']:>14,}")
    spread = max(counts) / min(counts) - 1
    print(f"  largest / smallest - 1 = {spread:.1%}")


# ------------------------------------------------------------------------------ runs
def _json(obj):
    return json.loads(json.dumps(obj))


def _diff(a, b, prefix="") -> list[str]:
    keys = sorted(set(a) | set(b))
    out = []
    for k in keys:
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _diff(x, y, f"{prefix}{k}.")
        elif x != y:
            out.append(f"{prefix}{k}")
    return out


def train_one(rc, run_dir: str, is_lead: bool = True) -> tuple[dict, float | None]:
    """Final metrics of one run: reused if finished with the same config, else trained/resumed.

    Returns (final metrics, training wall seconds or None when reused).
    """
    os.makedirs(run_dir, exist_ok=True)
    wanted = _json(rc.to_dict())
    saved_path = os.path.join(run_dir, RUN_CONFIG)
    if os.path.exists(saved_path):
        with open(saved_path) as f:  # this module reads only JSON (data only), never pickles
            saved = json.load(f)
        if saved != wanted:
            raise ValueError(
                f"{run_dir} was trained with another config (differs in "
                f"{', '.join(_diff(saved, wanted)[:5])}); use a fresh --workdir or delete it"
            )
        final_path = os.path.join(run_dir, FINAL_METRICS)
        if os.path.exists(final_path):
            with open(final_path) as f:
                final = json.load(f)
            if final.get("step") == rc.train.steps:
                print(f"Reusing {final_path}")
                return final, None
    elif is_lead:
        with open(saved_path, "w") as f:
            json.dump(wanted, f, indent=2)
    start = time.perf_counter()
    final = train_and_evaluate(rc, run_dir)
    return final, time.perf_counter() - start


def lambada_results(run_dir: str, path: str, batch_size: int) -> dict:
    """LAMBADA results of a finished run (cached per file and step)."""
    from gpn_jax.checkpoints.restore import load_run
    from gpn_jax.eval import run_evals

    path = os.path.abspath(os.path.expanduser(path))
    st = os.stat(path)
    key = {"path": path, "size": st.st_size, "mtime": st.st_mtime}
    cache = os.path.join(run_dir, LAMBADA_CACHE)
    run = load_run(run_dir)
    key["step"] = int(run.step)
    if os.path.exists(cache):
        with open(cache) as f:
            saved = json.load(f)
        if saved.get("key") == key:
            return saved["lambada"]
    res = run_evals(run, ["lambada"], lambada_path=path, batch_size=batch_size)["lambada"]
    with open(cache, "w") as f:
        json.dump({"key": key, "lambada": res}, f, indent=2)
    return res


def _check_same_heldout(rows: list[dict]) -> tuple[int, float]:
    runs = [r for row in rows for r in row.get("runs", [row])]
    seen = {(r["heldout_tokens"], round(r["unigram_ppl"], 6)) for r in runs}
    if len(seen) != 1:
        raise ValueError(
            "the runs were evaluated on different held-out tokens "
            f"({[(r['workdir'], r['heldout_tokens']) for r in runs]}); use a fresh --workdir"
        )
    return runs[0]["heldout_tokens"], runs[0]["unigram_ppl"]


# ------------------------------------------------------------------------------ the job
BUDGET_KEYS = ("steps", "batch_size", "seq_len", "grad_accum", "learning_rate", "warmup_steps",
               "min_lr_ratio", "weight_decay", "b1", "b2", "grad_clip")  # fmt: skip


def _model_rows(config, names: list[str], workdir: str, seeds: int = 1) -> list[dict]:
    """One row per model; its `runs` are the seeds (`compare_seeds.run_dir`), and its
    `workdir` the first seed's run (LAMBADA, harness and the loss plot read that one)."""
    rows = []
    for n in names:
        dirs = [compare_seeds.run_dir(workdir, n, k, seeds) for k in range(seeds)]
        runs = [
            {"seed": config.seed + k, "workdir": d, "run": os.path.relpath(d, workdir)}
            for k, d in enumerate(dirs)
        ]
        rows.append(
            {"name": n, "label": label(config, n), "workdir": runs[0]["workdir"], "runs": runs}
            | model_stats(run_config(config, n).model, config.train.seq_len)
        )
    return rows


_RUN_KEYS = ("heldout_ppl", "heldout_loss", "unigram_ppl", "heldout_tokens", "tokens_seen", "step")


def _train_run(config, row: dict, run: dict, tokenizer: str, is_lead: bool) -> dict | None:
    """Trains (or reuses) one seed's run and adds its final metrics; a stop dict if stopped."""
    seed = run["seed"] if len(row["runs"]) > 1 else None  # one seed: the shared seed, as before
    rc = run_config(config, row["name"], tokenizer, seed)
    final, seconds = train_one(rc, run["workdir"], is_lead)
    if "stopped_at" in final:
        print("Stopped; rerun the same command to resume.")
        return {"stopped_at": {run["run"]: final["stopped_at"]}}
    run |= {k: final[k] for k in _RUN_KEYS} | {"train_seconds": seconds}
    _, loss, _, _ = compare_report.loss_curve(run["workdir"])
    run["final_train_loss"] = loss[-1] if loss else None
    if run["heldout_tokens"]:
        run |= compare_seeds.train_ppl(run["workdir"], run["heldout_tokens"])
    run["gap"] = compare_seeds.overfit_gap(run["heldout_ppl"], run.get("train_ppl"))
    run["unigram_gap"] = compare_seeds.overfit_gap(run["unigram_ppl"], run.get("train_unigram_ppl"))
    return None


def _train_rows(config, rows: list[dict], tokenizer: str, is_lead: bool) -> dict | None:
    """Trains (or reuses) every row's runs and adds the aggregates; a stop dict if stopped."""
    for i, row in enumerate(rows, 1):
        for run in row["runs"]:
            print(f"[{i}/{len(rows)}] {row['label']} seed {run['seed']} -> {run['workdir']}")
            stopped = _train_run(config, row, run, tokenizer, is_lead)
            if stopped:
                return stopped
        first = row["runs"][0]
        row |= {k: first[k] for k in _RUN_KEYS} | compare_seeds.aggregate(row)
        row["train_seconds"] = sum(r["train_seconds"] or 0 for r in row["runs"]) or None
        row["final_train_loss"] = first["final_train_loss"]
    return None


def _lambada_rows(config, rows: list[dict], lambada_path: str | None) -> dict:
    """Adds the LAMBADA columns; returns the table's LAMBADA note block."""
    note = "not run (pass --lambada_path=<lambada_openai jsonl>)"
    for row in rows:
        res = None
        if lambada_path:
            res = lambada_results(row["workdir"], lambada_path, config.compare.lambada_batch_size)
        row["lambada"] = res
        row["lambada_acc"] = res["paper"]["acc"] if res else None
        row["lambada_ppl"] = res["paper"]["ppl"] if res else None
    ran = all(r["lambada"] is not None for r in rows) and bool(lambada_path)
    return {"path": os.path.abspath(lambada_path) if ran else None, "note": None if ran else note}


def _budget(t) -> dict:
    budget = {k: t[k] for k in BUDGET_KEYS}
    tokens_per_step = t.batch_size * t.seq_len
    return budget | {"tokens_per_step": tokens_per_step, "tokens": t.steps * tokens_per_step}


def _write_outputs(result: dict, rows: list[dict], budget: dict) -> None:
    files = result["files"]
    md = compare_report.markdown(result)
    with open(files["markdown"], "w") as f:
        f.write(md)
    with open(files["json"], "w") as f:
        json.dump(result, f, indent=2)
    compare_report.plot_losses(rows, budget, files["plot"])
    print()
    print(md)
    print(f"Wrote {files['markdown']}, {TABLE_JSON} and {PLOT}")


def compare(
    config,
    workdir: str,
    lambada_path: str | None = None,
    tasks: str | None = None,
    include_path: str | None = None,
    seeds: int | None = None,
) -> dict:
    """Trains (or reuses) every model of a compare config and writes the comparison.

    `tasks` (lm-eval task names, e.g. 'wikitext,lambada_openai,piqa') adds the GDN paper's
    table from lm-evaluation-harness (`harness_table`), `include_path` a local task folder.
    `seeds` (default `compare.seeds`, else 1) trains every model that many times
    (`compare_seeds`); `compare.analyze` adds the paper's claims (`compare_claims`).
    Returns the `comparison.json` dict ({'budget', 'data', 'rows', ...}), or
    {'stopped_at': {name or name/s<k>: step}} if SIGTERM stopped a run (rerun to resume).
    """
    workdir = prepare_workdir(workdir)
    seeds = compare_seeds.seed_count(config, seeds)
    names = model_names(config)
    check_shared(config)
    lambada_path = lambada_path or config.compare.get("lambada_path") or None
    if lambada_path and not os.path.isfile(lambada_path):
        raise FileNotFoundError(f"LAMBADA file not found: {lambada_path}")
    if tasks:
        paper_table.require_lm_eval()
    is_lead = jax.process_index() == 0
    rows = _model_rows(config, names, workdir, seeds)
    print_param_counts(rows)
    tokenizer = shared_tokenizer(config, workdir)
    stopped = _train_rows(config, rows, tokenizer, is_lead)
    if stopped:
        return stopped
    lambada = _lambada_rows(config, rows, lambada_path)
    heldout_tokens, unigram = _check_same_heldout(rows)
    budget = _budget(config.train)
    if config.compare.get("analyze", False):
        compare_claims.analyze_rows(rows, workdir, config.compare.get("analysis_batches", 0))
    result = {
        "columns": list(COLUMNS),
        "seeds": seeds,
        "gap_warnings": compare_seeds.gap_warnings(rows),
        "claims": compare_claims.claims(rows),
        "budget": budget,
        "data": {"source": config.data.source, "tokenizer": tokenizer, "seed": config.seed},
        "heldout_tokens": heldout_tokens,
        "unigram_ppl": unigram,
        "lambada": lambada,
        "rows": rows,
        "files": {name: os.path.join(workdir, f)
                  for name, f in (("markdown", TABLE_MD), ("json", TABLE_JSON), ("plot", PLOT))},
    }  # fmt: skip
    if tasks:
        result["harness"] = paper_table.harness_table(rows, tasks, include_path)
    if is_lead:
        _write_outputs(result, rows, budget)
    return result


# ------------------------------------------------------------------------------ command line
_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "compare config file (experiments/configs/compare_*.py).",
    allow_override=True,  # tests import several entry points into one process
)
_WORKDIR = flags.DEFINE_string(
    "workdir",
    None,
    "Comparison directory: one subdirectory per model, the table and the plot.",
    allow_override=True,
)
_TASKS = flags.DEFINE_string(
    "tasks",
    None,
    "lm-eval tasks for the GDN paper's table, e.g. wikitext,lambada_openai,piqa,hellaswag,"
    "winogrande,arc_easy,arc_challenge (their data must be available locally).",
    allow_override=True,
)
_INCLUDE = flags.DEFINE_string(
    "include_path",
    None,
    "lm-eval --include_path: a folder of local task YAMLs.",
    allow_override=True,
)
_SEEDS = flags.DEFINE_integer(
    "seeds",
    None,
    "Runs per model, seeds seed..seed+N-1 in <workdir>/<model>/s<k> (default: compare.seeds, "
    "else 1); the table reports mean ± std.",
    allow_override=True,
)
_LAMBADA = flags.DEFINE_string(
    "lambada_path",
    None,
    "lambada_openai jsonl file; adds LAMBADA acc / PPL columns.",
    allow_override=True,
)
flags.mark_flags_as_required(["config", "workdir"])


def _body():
    config = cli.config_or_exit(_CONFIG, "gpn-compare")
    if config.train.reuse_step_memory:  # as the gpn-train launcher
        host_memory.inline_cpu_steps()  # (before JAX starts; `training.host_memory`)
    distributed.initialize()
    start = time.perf_counter()
    result = compare(
        config, _WORKDIR.value, _LAMBADA.value, _TASKS.value, _INCLUDE.value, _SEEDS.value
    )
    if "rows" in result:
        print(f"Total wall time {time.perf_counter() - start:,.0f} s")
    return result


main, run = cli.absl_entry(_body, "gpn-compare")


if __name__ == "__main__":
    run()
