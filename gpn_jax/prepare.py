"""Prepares a corpus for `bin:` training: text -> SentencePiece token shards + manifest.

    python -m gpn_jax.prepare --input='/data/fineweb-edu/sample/10BT/*.parquet' \\
        --output=/data/fineweb_edu --tokenizer_path=/data/llama2/tokenizer.model
    python -m gpn_jax.train --config=experiments/configs/gpn_m_1l_130m.py --workdir=/runs/x \\
        --config.data.source=bin:/data/fineweb_edu

Inputs: a file, directory or glob of .txt / .jsonl / .jsonl.gz / .jsonl.zst / .parquet, or
`tfds:NAME[/CONFIG][:SPLIT]` (with --data_dir). Output: `train/data_NNNN.bin` and
`heldout/data_NNNN.bin` (uint16 tokens if the vocabulary fits, else uint32; an eos after
every document), `tokenizer.model` and `manifest.json` (written last). Held-out documents are
chosen by a hash of their number, or stratified by difficulty (`--heldout_stratified`, see
`gpn_jax.data.prepare.heldout`), or are the first `--heldout_docs`. The shards are the
same bytes whatever --workers is; rerunning the same command after a kill finishes the job
without redoing finished shards. Bad input prints one line and exits with status 1.
--output must be new, empty, or an earlier output of gpn-prepare (marked by its `.gpn_prepare`
file); files there that gpn-prepare did not write are never touched, and `--overwrite`
replaces only what it wrote.
"""

import shlex
import sys

from absl import flags

_INPUT = flags.DEFINE_string("input", None, "File, directory, glob, or tfds:NAME[/CONFIG][:SPLIT].")
_OUTPUT = flags.DEFINE_string("output", None, "Output directory (created; resumed if partial).")
_TOKENIZER = flags.DEFINE_string(
    "tokenizer_path", None, "Existing SentencePiece .model (e.g. LLaMA-2's)."
)
_VOCAB = flags.DEFINE_integer("vocab_size", 0, "Train a tokenizer of this vocabulary instead.")
_SAMPLE = flags.DEFINE_integer(
    "tokenizer_sample_docs", 50_000, "Training documents the new tokenizer is trained on."
)
_FIELD = flags.DEFINE_string("text_field", "text", "Text field of jsonl / parquet / tfds records.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "tfds data_dir (for tfds: inputs).")
_WORKERS = flags.DEFINE_integer("workers", 0, "Tokenizing processes (0: all cores).")
_HELDOUT_FRACTION = flags.DEFINE_float(
    "heldout_fraction",
    None,
    "Share of documents held out, chosen by a hash of their number (default 0.001, or 0 "
    "with --heldout_docs).",
)
_HELDOUT_DOCS = flags.DEFINE_integer(
    "heldout_docs", 0, "Hold out the first N documents instead (for pre-shuffled corpora)."
)
_HELDOUT_STRATIFIED = flags.DEFINE_bool(
    "heldout_stratified",
    False,
    "With --heldout_fraction=p: hold out one of every 1/p documents of like difficulty (word-"
    "unigram surprisal), so held-out is as hard as train (small corpora: reads them twice).",
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the held-out choice.")
_SHARD_TOKENS = flags.DEFINE_integer("shard_tokens", 1 << 27, "Tokens per shard file.")
_CHUNK = flags.DEFINE_integer("chunk_records", 256, "Records per tokenizing task.")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar (on a terminal).")
_OVERWRITE = flags.DEFINE_bool(
    "overwrite",
    False,
    "Replace what gpn-prepare wrote in --output (e.g. another corpus); other files are kept.",
)
flags.mark_flags_as_required(["input", "output"])
PROG = "gpn-prepare"


def _body():
    from gpn_jax.data.prepare.run import Options, prepare_corpus

    options = Options(
        input=_INPUT.value,
        output=_OUTPUT.value,
        tokenizer_path=_TOKENIZER.value,
        vocab_size=_VOCAB.value,
        tokenizer_sample_docs=_SAMPLE.value,
        text_field=_FIELD.value,
        data_dir=_DATA_DIR.value,
        workers=_WORKERS.value,
        heldout_fraction=_HELDOUT_FRACTION.value,
        heldout_docs=_HELDOUT_DOCS.value,
        heldout_stratified=_HELDOUT_STRATIFIED.value,
        seed=_SEED.value,
        shard_tokens=_SHARD_TOKENS.value,
        chunk_records=_CHUNK.value,
        command=_command(),
        progress=_PROGRESS.value,
        overwrite=_OVERWRITE.value,
    )
    prepare_corpus(options)


def _command() -> str:
    """The command line as typed (`python -m` shows the module's file as argv[0])."""
    argv = sys.argv
    if argv and argv[0].endswith(".py"):
        argv = ["python", "-m", "gpn_jax.prepare", *argv[1:]]
    return shlex.join(argv)


def run():
    """The console script and `python -m`. The shared CLI module (and with it JAX) is imported
    here, not at the top: the tokenizing workers re-import this module when they start
    (multiprocessing 'spawn') and should load only the tokenizer, not JAX."""
    from gpn_jax.io import cli

    cli.absl_entry(_body, PROG)[1]()


if __name__ == "__main__":
    run()
