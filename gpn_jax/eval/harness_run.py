"""What `python -m gpn_jax.harness` does: lm-evaluation-harness's own CLI with the "gpn_jax"
model registered (`harness_lm`) and chosen by default, `zero_shot` expanded to the set papers
report, a task index over --include_path alone when every task is local, one line for a dataset
missing while downloads are off, and lm-eval's scores as a gpn_jax result file (`--out`)."""

import contextlib
import glob
import json
import os
import platform
import shlex
import sys
import tempfile
import time

from gpn_jax.io import cli, provenance
from gpn_jax.io.regular import read_regular_file

_MAX_RESULTS_BYTES = 256 << 20  # an lm-eval results file is a few MiB

# The zero-shot set papers on recurrent LMs at this scale report (Gated DeltaNet, FLA, Mamba):
# lm-eval task names, `--tasks zero_shot`.
ZERO_SHOT = (
    "lambada_openai", "hellaswag", "piqa", "arc_easy", "arc_challenge", "winogrande", "wikitext",
)  # fmt: skip
# (column, task, metric key) as those papers' tables print them; other tasks get
# "<task> <metric>" columns.
COLUMNS = (
    ("Wiki. ppl", "wikitext", "word_perplexity,none"),
    ("LMB. ppl", "lambada_openai", "perplexity,none"),
    ("LMB. acc", "lambada_openai", "acc,none"),
    ("PIQA acc", "piqa", "acc,none"),
    ("Hella. acc_n", "hellaswag", "acc_norm,none"),
    ("Wino. acc", "winogrande", "acc,none"),
    ("ARC-e acc", "arc_easy", "acc,none"),
    ("ARC-c acc_n", "arc_challenge", "acc_norm,none"),
)


def harness_argv(argv: list[str]) -> list[str]:
    """`argv` (flags only) with `--model gpn_jax` added unless a model is named, and
    `zero_shot` in the --tasks value expanded to `ZERO_SHOT`."""
    named = any(a in ("--model", "-M") or a.startswith("--model=") for a in argv)
    out = list(argv)
    for i, a in enumerate(out):
        if a.startswith("--tasks="):
            out[i] = "--tasks=" + _expand(a[len("--tasks=") :])
        elif a in ("--tasks", "-t") and i + 1 < len(out):
            out[i + 1] = _expand(out[i + 1])
    return out if named else ["--model", "gpn_jax", *out]


def _expand(value: str) -> str:
    names = [
        n for name in value.split(",") for n in (ZERO_SHOT if name == "zero_shot" else (name,))
    ]
    return ",".join(dict.fromkeys(names))


def own_flags(argv: list[str]) -> tuple[list[str], dict]:
    """(lm-eval's flags, {'out': ..., 'label': ...}): --out and --label are gpn_jax's."""
    rest, own, i = [], {"out": None, "label": None}, 0
    while i < len(argv):
        a = argv[i]
        key = next((k for k in own if a == f"--{k}" or a.startswith(f"--{k}=")), None)
        if key is None:
            rest.append(a)
        elif "=" in a:
            own[key] = a.split("=", 1)[1]
        elif i + 1 < len(argv):
            own[key], i = argv[i + 1], i + 1
        else:
            raise ValueError(f"--{key} needs a value")
        i += 1
    return rest, own


def flag_values(argv: list[str], *names: str) -> list[str]:
    """The value(s) of the first of `names` in `argv`: `--name=value`, or every word after
    `--name` up to the next flag (lm-eval's --model_args takes `k=v,k2=v2` or `k=v k2=v2`)."""
    for i, a in enumerate(argv):
        for name in names:
            if a.startswith(name + "="):
                return [a.split("=", 1)[1]]
            if a == name:
                words = []
                for w in argv[i + 1 :]:
                    if w.startswith("-"):
                        break
                    words.append(w)
                return words
    return []


def evaluate(argv: list[str], usage: str, prog: str) -> None:
    """lm-eval's CLI on `argv` with the gpn_jax model registered and chosen by default; `usage`
    (printed first with --help) and `prog` are the entry point's."""
    # --helpfull too, as every other gpn-* entry point (absl) takes it; lm-eval knows --help
    wants_help = any(a in ("-h", "--help", "--helpfull") for a in argv)
    if wants_help:
        print(usage)
        argv = ["--help" if a == "--helpfull" else a for a in argv]
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):  # before datasets is imported
        os.environ.setdefault(var, "1")
    argv, own = own_flags(argv)
    try:
        from lm_eval.__main__ import cli_evaluate
        from lm_eval.utils import simple_parse_args_string

        if not wants_help:  # lm-eval's help needs no model: JAX and the model stay unimported
            from gpn_jax.eval import harness_lm  # registers the "gpn_jax" model
    except ImportError as e:
        raise ValueError(f"lm-eval is not installed ({e}); pip install -e '.[eval]'") from None
    args = harness_argv(argv)
    if wants_help:  # lm-eval's CLI prints its help and exits
        saved, sys.argv = sys.argv, [prog, *args]
        try:
            cli_evaluate()
        finally:
            sys.argv = saved
        return
    cli.settle_heap()  # lm-eval's and JAX's stack out of the garbage collector's passes
    model_args = ",".join(flag_values(args, "--model_args", "-a"))
    if flag_values(args, "--model", "-M")[:1] == ["gpn_jax"] and model_args:
        # before lm-eval's CLI, which indexes every task file (~12 s) before building the model
        harness_lm.check_model_args(simple_parse_args_string(model_args))
    with tempfile.TemporaryDirectory(prefix="gpn-harness-") as tmp:
        if own["out"]:
            from gpn_jax.io.outputs import check_out_file

            check_out_file(own["out"], "--out")  # before any work
            if not flag_values(args, "--output_path", "-o"):
                args += ["--output_path", tmp]
        started = time.time()
        saved = sys.argv
        sys.argv = [prog, *args]
        try:
            with task_index(args, prog):
                cli_evaluate()
        except Exception as e:
            hint = offline_error(e)
            if hint is None:
                raise
            raise ValueError(hint) from None
        finally:
            sys.argv = saved
        if own["out"]:
            path = _newest_results(flag_values(args, "--output_path", "-o")[0], started)
            raw = read_regular_file(path, _MAX_RESULTS_BYTES)  # lm-eval's own output: data only
            record = result_file(json.loads(raw), argv, own["label"], model_args)
            _write_json(own["out"], record)
            print(f"results: {own['out']}")


def offline_error(e: BaseException) -> str | None:
    """One line for a dataset that is not in the Hugging Face cache while downloads are off
    (`datasets`' "Couldn't reach ... (OfflineModeIsEnabled)"): how to allow the download or
    where local data goes; None for any other error."""
    chain, seen = [], e
    while seen is not None:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    if not any("OfflineModeIsEnabled" in f"{type(x).__name__} {x}" for x in chain):
        return None
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return (
        f"{first}; downloads are off: run once with HF_DATASETS_OFFLINE=0 HF_HUB_OFFLINE=0 to "
        "fill the Hugging Face cache, or give --include_path DIR of task YAMLs reading local files"
    )


def local_tasks(argv: list[str]) -> str | None:
    """The --include_path directory when every --tasks name is a task (not a group or tag) found
    there, else None: then lm-eval need not index its ~14,000 built-in task files (~12 s)."""
    include = flag_values(argv, "--include_path")
    names = [n for v in flag_values(argv, "--tasks", "-t") for n in v.split(",") if n]
    if len(include) != 1 or not names or not os.path.isdir(include[0]):
        return None
    from lm_eval.tasks import TaskManager

    own = TaskManager(include_path=include[0], include_defaults=False)
    return include[0] if set(names) <= set(own.all_subtasks) else None


@contextlib.contextmanager
def task_index(argv: list[str], prog: str = "gpn-harness"):
    """lm-eval's CLI with a task index over --include_path alone when `local_tasks(argv)` holds
    (lm-eval's own `TaskManager(include_defaults=False)`: the same tasks, as a local task shadows
    a built-in one of the same name anyway); otherwise unchanged."""
    import lm_eval.tasks

    if local_tasks(argv) is None:
        yield
        return
    full = lm_eval.tasks.TaskManager

    class LocalTaskManager(full):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "include_defaults": False})

    print(
        f"{prog}: every task is in --include_path; lm-eval's built-in tasks are not indexed",
        file=sys.stderr,
    )
    lm_eval.tasks.TaskManager = LocalTaskManager  # what lm-eval's CLI builds its index with
    try:
        yield
    finally:
        lm_eval.tasks.TaskManager = full


def _newest_results(output_path: str, since: float) -> str:
    """The results_*.json lm-eval wrote under `output_path` during this run."""
    root = output_path if os.path.isdir(output_path) else os.path.dirname(output_path)
    found = [p for p in glob.glob(os.path.join(root, "**", "results_*.json"), recursive=True)
             if os.path.getmtime(p) >= since - 1]  # fmt: skip
    if not found:
        raise ValueError(f"lm-eval wrote no results_*.json under {output_path}; nothing for --out")
    return max(found, key=os.path.getmtime)


def result_file(results: dict, argv: list[str], label: str | None, model_args: str) -> dict:
    """lm-eval's results JSON as a gpn_jax result file: one row per (task, metric)."""

    named = {(t, m): c for c, t, m in COLUMNS}
    workdir = dict(kv.split("=", 1) for kv in model_args.split(",") if "=" in kv).get("workdir")
    label = label or os.path.basename(os.path.normpath(workdir or "model"))
    rows = []
    for task, metrics in sorted((results.get("results") or {}).items()):
        for key, value in metrics.items():
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            if not numeric or "," not in key or "stderr" in key:
                continue  # lm-eval's "metric,filter" scores only (not sample_len, alias)
            err = metrics.get(key.replace(",", "_stderr,", 1))
            rows.append({
                "model": label, "task": task, "metric": key,
                "column": named.get((task, key), f"{task} {key.split(',')[0]}"),
                "value": value, "stderr": err if isinstance(err, int | float) else None,
            })  # fmt: skip
    if not rows:
        raise ValueError("lm-eval returned no numeric scores; nothing for --out")
    return {
        "command": shlex.join(["python", "-m", "gpn_jax.harness", *argv]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "version": f"gpn_jax {provenance.package_version()}, lm-eval {_lm_eval_version()}",
        "label": label,
        "model_args": model_args,
        "rows": rows,
    }


def _lm_eval_version() -> str:
    return provenance.installed_version("lm_eval", "?")


def _write_json(path: str, record: dict) -> None:
    from gpn_jax.io.files import atomic_write

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write(path, json.dumps(record, indent=1).encode())
