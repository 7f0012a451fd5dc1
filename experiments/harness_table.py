"""The Gated DeltaNet paper's results table from lm-evaluation-harness, for `experiments.compare`.

Columns (task, metric) as the GDN and FLA papers report them: WikiText word perplexity,
LAMBADA (OpenAI) perplexity and accuracy, PIQA acc, HellaSwag acc_norm, WinoGrande acc,
ARC-e acc, ARC-c acc_norm, and the average of the six accuracy columns. Every model of a
comparison is scored by `gpn_jax.eval.harness_lm.GPNLM`. Tasks run offline (HF_DATASETS_OFFLINE
is set unless the caller set it): a task whose data is not on this machine, or that lm-eval
does not know, leaves its columns empty with the reason in `missing`. Tasks outside the
paper's list get columns of their own ("<task> <metric>").
"""

import math
import os

from gpn_jax.eval.harness_run import COLUMNS as PAPER  # (column, lm-eval task, metric key)

AVG = "Avg."
ACC_COLUMNS = tuple(c for c, _, _ in PAPER if "acc" in c)


def parse_tasks(tasks) -> list[str]:
    names = tasks.split(",") if isinstance(tasks, str) else list(tasks)
    return list(dict.fromkeys(n.strip() for n in names if n and n.strip()))


def require_lm_eval() -> None:
    """Fails (one line) before any training when lm-eval is missing."""
    try:
        import lm_eval  # noqa: F401
    except ImportError as e:
        raise ValueError(f"--tasks needs lm-eval ({e}); pip install -e '.[eval]'") from None


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160]}" if text else type(e).__name__


def run_task(lm, task: str, task_manager, limit=None) -> tuple[dict | None, str | None]:
    """(metrics, None) or (None, why the task could not run here)."""
    import lm_eval

    if task not in task_manager.all_tasks:
        return None, f"task '{task}' unknown to lm-eval (add its YAML with --include_path)"
    try:
        out = lm_eval.simple_evaluate(model=lm, tasks=[task], task_manager=task_manager,
                                      limit=limit)  # fmt: skip
    except Exception as e:  # noqa: BLE001 - any failure to load the data is reported, not fatal
        return None, f"task '{task}' not available offline ({_first_line(e)})"
    return out["results"][task], None


def _columns_of(task: str, metrics: dict) -> list[tuple[str, str]]:
    """(column, metric key) of a task: the paper's, else every numeric non-stderr metric."""
    paper = [(c, m) for c, t, m in PAPER if t == task]
    if paper:
        return paper
    keys = [k for k, v in metrics.items() if "stderr" not in k and isinstance(v, int | float)]
    return [(f"{task} {k.split(',')[0]}", k) for k in keys]


def _offline() -> None:
    """Hugging Face downloads off (unless the caller chose): the table reports what is local.
    The libraries read the variables at import, so already-imported ones are set directly."""
    if os.environ.get("HF_DATASETS_OFFLINE", "1") == "0":
        return
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        os.environ[var] = "1"
    import datasets.config
    import huggingface_hub.constants

    datasets.config.HF_DATASETS_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    huggingface_hub.constants.HF_HUB_OFFLINE = True


def harness_table(rows: list[dict], tasks, include_path: str | None = None, limit=None) -> dict:
    """{'columns', 'rows': [{'label', column: value}], 'missing': {column: reason}}.

    `rows`: the comparison's rows (each with 'label' and the run's 'workdir').
    """
    require_lm_eval()
    from lm_eval.tasks import TaskManager

    from gpn_jax.eval.harness_lm import GPNLM

    _offline()
    names = parse_tasks(tasks)
    tm = TaskManager(include_path=include_path)
    missing = {c: f"task '{t}' not in --tasks" for c, t, _ in PAPER if t not in names}
    columns, out, failed = [c for c, t, _ in PAPER if t in names], [], {}
    for row in rows:
        lm, values = GPNLM(workdir=row["workdir"]), {"label": row["label"]}
        for task in (t for t in names if t not in failed):
            metrics, why = run_task(lm, task, tm, limit)
            if why:
                failed[task] = why
                continue
            for column, key in _columns_of(task, metrics):
                columns += [] if column in columns else [column]
                values[column] = metrics.get(key)
        out.append(values)
    for task, why in failed.items():
        for column in [c for c, t, _ in PAPER if t == task] or [task]:
            missing[column] = why
    _average(out, columns, missing)
    return {"columns": columns, "rows": out, "missing": missing, "tasks": names}


def _average(rows: list[dict], columns: list[str], missing: dict) -> None:
    """The paper's average: the mean of the six accuracy columns (only when all are filled)."""
    absent = [c for c in ACC_COLUMNS if c not in columns or c in missing]
    columns.append(AVG)
    if absent:
        missing[AVG] = f"needs every accuracy column (missing {', '.join(absent)})"
        return
    for r in rows:
        vals = [r.get(c) for c in ACC_COLUMNS]
        r[AVG] = None if any(v is None for v in vals) else sum(vals) / len(vals)


def markdown(table: dict) -> str:
    cols = table["columns"]
    lines = ["| Model | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for r in table["rows"]:
        cells = [_cell(r.get(c), c) for c in cols]
        lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    lines += [f"- {c}: not filled: {why}" for c, why in table["missing"].items()]
    return "\n".join(lines) + "\n"


def _cell(v, column: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v:.2f}" if "ppl" in column or "perplexity" in column else f"{v:.3f}"
