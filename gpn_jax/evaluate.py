"""Evaluates a trained run: held-out PPL, LAMBADA, streaming long context, associative recall.

    python -m gpn_jax.evaluate --workdir=/tmp/run --eval=ppl,lambada,stream,recall \\
        --lambada_path=lambada_test.jsonl --out=results.json

Thin absl launcher over `gpn_jax.eval.suite.run_evals`. Results are printed as a short table and
written to `--out` if given (merged with an earlier `--out` file of the same run and step); the
run's workdir is only read (token caches go to `--cache_dir` or a temporary directory). User
errors (missing checkpoint, malformed jsonl line, empty file, tokenizer mismatch) print one line
and exit with status 1.

`--model_dir=<dir>` evaluates an exported model (`gpn_jax.export`) instead of a workdir. Evals
that read the held-out split (ppl, stream without --stream_path, recall) rebuild it from the
data block recorded in the directory's config.json, with its tokenizer — the same windows as
training's when that source is readable here (`embedded` always is; a file or tfds source must
exist at the recorded path, else one line says so). Data caches go to a temporary directory
and results only to --out: the model directory is never written.
"""

from absl import flags

from gpn_jax.io import cli

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory holding checkpoints.")
_MODEL_DIR = flags.DEFINE_string("model_dir", None, "Exported model (gpn_jax.export) instead.")
_EVAL = flags.DEFINE_string("eval", "ppl", "Comma-separated evals: ppl, lambada, stream, recall.")
_LAMBADA = flags.DEFINE_string(
    "lambada_path", None, "lambada_openai jsonl file (for --eval=lambada)."
)
_OUT = flags.DEFINE_string("out", None, "Write the results to this JSON file.")
_CACHE = flags.DEFINE_string(
    "cache_dir", None, "Token caches (default: a temporary directory; never the workdir)."
)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the newest readable one).")
_TOKENIZER = flags.DEFINE_string("tokenizer_path", None, "Tokenizer to use instead of the run's.")
_BATCH = flags.DEFINE_integer("batch_size", 16, "LAMBADA / recall examples per forward pass.")
_PPL_BATCHES = flags.DEFINE_integer("ppl_max_batches", 0, "Held-out batches for ppl (0: all).")
_BUCKETS = flags.DEFINE_string("stream_buckets", "0,2k,8k,32k", "Stream position bucket edges.")
_WINDOW = flags.DEFINE_integer("stream_window", 0, "Tokens per streamed window (0: train seq_len).")
_STREAMS = flags.DEFINE_integer("stream_streams", 1, "Parallel streams cut from the stream tokens.")
_STREAM_PATH = flags.DEFINE_string("stream_path", None, "Text file to stream (default: held-out).")
_STREAM_DOCS = flags.DEFINE_bool(
    "stream_documents", False, "Stream: reset at document starts; bucket by position in document."
)
_RECALL_N = flags.DEFINE_integer("recall_examples", None, "Held-out recall examples (default all).")


def evaluate(workdir: str | None, model_dir: str | None = None) -> dict:
    """Parses what can fail cheaply first, then restores the run and evaluates it."""
    from gpn_jax.io.outputs import check_out_file

    # before any work, JAX's import included: a result that cannot be written fails at once
    check_out_file(_OUT.value, "--out")
    from gpn_jax.checkpoints.model_dir import load_either
    from gpn_jax.eval import lambada, suite

    cli.settle_heap()  # the imported stack out of the garbage collector's passes
    evals = suite.parse_evals(_EVAL.value)
    if "lambada" in evals:
        if not _LAMBADA.value:
            raise ValueError("--eval=lambada needs --lambada_path")
        lambada.read_lambada(_LAMBADA.value)
    run = load_either(workdir, model_dir, _STEP.value)
    suite.check_results_file(_OUT.value, run.workdir, int(run.step))  # before the evaluation
    results = _run_evals(run, evals)
    print(suite.format_table(results))
    if _OUT.value:
        print(f"results: {suite.write_results(results, _OUT.value)}")
    else:
        print("(no --out: results not written)")
    return results


def _run_evals(run, evals) -> dict:
    from gpn_jax.eval import suite

    return suite.run_evals(
        run,
        evals,
        cache_dir=_CACHE.value,
        lambada_path=_LAMBADA.value,
        tokenizer_path=_TOKENIZER.value,
        batch_size=_BATCH.value,
        ppl_max_batches=_PPL_BATCHES.value,
        stream_buckets=_BUCKETS.value,
        stream_window=_WINDOW.value,
        stream_streams=_STREAMS.value,
        stream_path=_STREAM_PATH.value,
        stream_documents=_STREAM_DOCS.value,
        recall_examples=_RECALL_N.value,
    )


def _body():
    return evaluate(_WORKDIR.value, _MODEL_DIR.value)


main, run = cli.absl_entry(_body, "gpn-evaluate")


if __name__ == "__main__":
    run()
