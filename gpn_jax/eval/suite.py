"""`run_evals(run, evals, ...) -> dict`: every evaluation of a restored run, nested by eval.

Shared by `python -m gpn_jax.evaluate` and Python / Colab callers::

    from gpn_jax.checkpoints.restore import load_run
    from gpn_jax.eval import run_evals
    results = run_evals(load_run(workdir), ["ppl", "lambada"], lambada_path="lambada.jsonl")
"""

import json
import os

from gpn_jax.data.tokenizer import check_vocab, load_tokenizer
from gpn_jax.eval import lambada, ppl, recall, stream
from gpn_jax.io import paths
from gpn_jax.io.files import atomic_write
from gpn_jax.io.outputs import check_out_file, check_outside
from gpn_jax.io.regular import MAX_TEXT_BYTES, read_regular_file, read_text
from gpn_jax.models import factory

MAX_RESULTS_BYTES = 16 << 20  # a results file is a few KB; a larger one is not ours


def parse_evals(evals) -> list[str]:
    """'ppl,lambada' or a list -> validated, de-duplicated names in the given order."""
    names = evals.split(",") if isinstance(evals, str) else list(evals)
    names = [n.strip() for n in names if n and n.strip()]
    unknown = [n for n in names if n not in EVALS]
    if unknown or not names:
        raise ValueError(f"unknown eval(s) {unknown or names}; choose from {','.join(EVALS)}")
    return list(dict.fromkeys(names))


def run_tokenizer(run, tokenizer_path: str | None = None):
    """The tokenizer to evaluate with (given path, else the run's), checked against the model."""
    tokenizer = load_tokenizer(tokenizer_path) if tokenizer_path else run.tokenizer
    if tokenizer is None:
        raise ValueError(
            f"run {run.workdir} has no tokenizer (tokenizer.model); pass a tokenizer path"
        )
    check_vocab(tokenizer, run.config.model.vocab_size)
    return tokenizer


class _Context:
    """What the evals of one `run_evals` call share: the run, the options, and the held-out
    data and tokenizer, each built at most once and only if an eval asks for it."""

    def __init__(self, run, options: dict, examples):
        self.run, self.options, self.examples = run, options, examples
        self._data = None

    @property
    def data(self):
        if self._data is None:
            self._data = ppl.heldout_data(self.run, self.options["cache_dir"])
        return self._data

    @property
    def tokenizer(self):
        return run_tokenizer(self.run, self.options["tokenizer_path"])


def _ppl(ctx: _Context) -> dict:
    return ppl.heldout_ppl(ctx.run, ctx.data, ctx.options["ppl_max_batches"])


def _lambada(ctx: _Context) -> dict:
    batch = ctx.options["batch_size"]
    return lambada.evaluate_lambada(
        ctx.run.model, ctx.run.params, ctx.tokenizer, ctx.examples, batch
    )


def _stream(ctx: _Context) -> dict:
    o = ctx.options
    if o["stream_path"]:
        tokens = ctx.tokenizer.encode(read_text(o["stream_path"], MAX_TEXT_BYTES))
        source = o["stream_path"]
    else:
        tokens, source = ctx.data.heldout, "held-out split"
    window = o["stream_window"] or ctx.run.config.train.seq_len
    eos = ctx.tokenizer.eos_id if o["stream_documents"] else None
    result = stream.stream_eval(
        ctx.run.model, ctx.run.params, tokens, window, o["stream_buckets"], o["stream_streams"],
        eos_id=eos,
    )  # fmt: skip
    return result | {"source": source}


def _recall(ctx: _Context) -> dict:
    o = ctx.options
    return recall.recall_eval(ctx.run, o["recall_examples"], max(o["batch_size"], 1))


# name -> eval(context) -> result dict. A new eval is one function and one entry here.
REGISTRY = {"ppl": _ppl, "lambada": _lambada, "stream": _stream, "recall": _recall}
EVALS = tuple(REGISTRY)


def run_evals(
    run,
    evals,
    *,
    lambada_path: str | None = None,
    tokenizer_path: str | None = None,
    batch_size: int = 16,
    ppl_max_batches: int = 0,
    stream_buckets=stream.DEFAULT_BUCKETS,
    stream_window: int = 0,
    stream_streams: int = 1,
    stream_path: str | None = None,
    stream_documents: bool = False,
    recall_examples: int | None = None,
    cache_dir: str | None = None,
) -> dict:
    """Runs `evals` on a restored run (`gpn_jax.checkpoints.restore.load_run`).

    Args:
      evals: names from EVALS ('ppl,lambada' or a list).
      lambada_path: lambada_openai jsonl file (needed for 'lambada').
      tokenizer_path: a tokenizer to use instead of the run's (must match the model's vocab).
      batch_size: LAMBADA / recall examples per forward pass.
      ppl_max_batches: held-out batches for 'ppl' (0: all of training's held-out windows).
      stream_buckets, stream_window, stream_streams: position bucket edges, tokens fed per
        call (0: the training seq_len) and parallel streams for 'stream'.
      stream_path: a text file to stream (default: the run's held-out token stream).
      stream_documents: reset the state at every document start (as stateful training does)
        and bucket by the position within the document (`eval.stream`).
      recall_examples: held-out recall examples (default: all the task holds out).
      cache_dir: token caches (default: a temporary directory; the workdir is only read).

    Returns:
      {'run': {workdir, step, family}, <eval>: its result, ...}.
    """
    options = dict(locals())
    del options["run"], options["evals"]
    names = parse_evals(evals)
    examples = None
    if "lambada" in names:
        if not lambada_path:
            raise ValueError("the lambada eval needs a LAMBADA jsonl file (--lambada_path)")
        examples = lambada.read_lambada(lambada_path)  # fails before any model work
    if examples is not None or ("stream" in names and stream_path):
        run_tokenizer(run, tokenizer_path)  # a wrong tokenizer fails before any model work
    ctx = _Context(run, options, examples)
    family = factory.family_name(run.config.model)
    results = {"run": {"workdir": run.workdir, "step": int(run.step), "family": family}}
    for name in names:
        results[name] = REGISTRY[name](ctx)
    return results


def check_results_file(out: str | None, workdir: str, step: int) -> None:
    """Before any evaluation: `out` may not lie inside the run's workdir, and an existing file
    there must be this run's results at this step (evals run one at a time accumulate in it);
    anything else the user has is never replaced. Raises a one-line ValueError."""
    if not out or paths.is_remote(out):
        return
    check_outside(out, workdir)
    full = os.path.realpath(os.path.expanduser(out))
    if not os.path.exists(full):
        return
    old = _read_results(full)
    run = old.get("run") if isinstance(old, dict) else None
    if not isinstance(run, dict) or (run.get("workdir"), run.get("step")) != (workdir, step):
        raise ValueError(
            f"--out={out} exists and is not this run's results at step {step}; "
            "choose another --out or move that file away"
        )


def _read_results(path: str):
    try:  # json: data only; a regular file of bounded size (`check_out_file` refused others)
        return json.loads(read_regular_file(path, MAX_RESULTS_BYTES))
    except (OSError, ValueError, RecursionError):
        return None


def write_results(results: dict, out: str) -> str:
    """Writes `results` to `out`, merged with the earlier results of the same run and step there
    (`check_results_file` refused anything else before the evaluation). Never writes into the
    run's workdir."""
    run = results["run"]
    check_out_file(out, "--out")
    check_results_file(out, run["workdir"], run["step"])
    old = _read_results(out) if os.path.exists(out) else None
    merged = (old | results) if isinstance(old, dict) else dict(results)
    atomic_write(out, json.dumps(merged, indent=2).encode())
    return out


def format_table(results: dict) -> str:
    """A short human-readable table of `results`."""
    rows = []
    if r := results.get("ppl"):
        rows.append(("ppl", "held-out PPL", f"{r['ppl']:.3f}", f"{r['tokens']:,} tokens"))
    if r := results.get("lambada"):
        for proto in ("paper", "harness"):
            p = r[proto]
            rows.append(
                ("lambada", f"{proto} acc / PPL", f"{p['acc']:.4f} / {p['ppl']:.3f}", f"n={r['n']}")
            )
    if r := results.get("stream"):
        reset = r.get("reset", {}).get("buckets", {})
        for bucket, b in r["buckets"].items():
            extra = f"reset {reset[bucket]['ppl']:.3f}" if bucket in reset else ""
            rows.append(("stream", f"PPL {bucket} ({r['mode']})", f"{b['ppl']:.3f}", extra))
    if r := results.get("recall"):
        rows.append(("recall", "query acc", f"{r['acc']:.4f}", f"chance {r['chance']:.4f}"))
    head = results.get("run", {})
    lines = [f"{head.get('family', '?')} step {head.get('step', '?')}: {head.get('workdir', '')}"]
    lines += [f"{a:<8} {b:<24} {c:>18}  {d}".rstrip() for a, b, c, d in rows]
    return "\n".join(lines)
