"""Benchmark of `gpn_jax.prepare` and of the `bin:` data loader (prints figures; asserts nothing).

    python -m gpn_jax.bench_prepare --sizes_mb=50,500 --workers=1,2 \\
        --workdir=runs/bench_prepare [--out=prepare.json]

Thin absl launcher over `gpn_jax.benchmarks.prepare.run` (what it measures is described there).
"""

from absl import flags

from gpn_jax.io import cli

_SIZES = flags.DEFINE_list("sizes_mb", ["50", "500"], "Corpus sizes to generate, in MB.")
_WORKERS = flags.DEFINE_list("workers", ["1", "2"], "Worker counts to run prepare with.")
_WORKDIR = flags.DEFINE_string(
    "workdir", "", "Corpora, outputs, results (default: a new private temporary directory)."
)
_OUT = flags.DEFINE_string("out", "", "Results JSON (default <workdir>/prepare.json).")
_VOCAB = flags.DEFINE_integer(
    "vocab_size", 4096, "Benchmark tokenizer vocabulary (the synthetic text allows < 6.5k)."
)
_BATCH = flags.DEFINE_integer("batch_size", 128, "Loader benchmark batch size.")
_SEQ = flags.DEFINE_integer("seq_len", 2048, "Loader benchmark window length.")
_LOADER_BATCHES = flags.DEFINE_integer("loader_batches", 100, "Batches timed per layout.")
_KEEP = flags.DEFINE_bool("keep", False, "Keep the prepared outputs (they are large).")


def _body():
    from gpn_jax.benchmarks import prepare

    return prepare.run(
        sizes_mb=[int(s) for s in _SIZES.value],
        workers=[int(w) for w in _WORKERS.value],
        workdir=_WORKDIR.value,
        out=_OUT.value,
        vocab_size=_VOCAB.value,
        batch_size=_BATCH.value,
        seq_len=_SEQ.value,
        loader_batches=_LOADER_BATCHES.value,
        keep=_KEEP.value,
    )


main, run = cli.absl_entry(_body, "gpn-bench-prepare")


if __name__ == "__main__":
    run()
