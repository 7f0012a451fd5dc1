"""The corpus tokenizer: a given SentencePiece model, or one trained on a bounded sample of
the training documents (never held-out ones); either way saved as `<output>/tokenizer.model`.
"""

import os

import numpy as np

from gpn_jax.data.prepare.encode import chunk_texts
from gpn_jax.data.prepare.heldout import HeldoutChoice, heldout_choice
from gpn_jax.data.prepare.inputs import Position
from gpn_jax.data.prepare.manifest import TOKENIZER
from gpn_jax.data.tokenizer import Tokenizer, load_tokenizer, train_tokenizer
from gpn_jax.io.files import atomic_write, sha256_file


def tokenizer_settings(opts) -> dict:
    """The part of the settings that names the tokenizer."""
    if opts.tokenizer_path:
        return {"sha256": sha256_file(opts.tokenizer_path)}
    return {"vocab_size": opts.vocab_size, "sample_docs": opts.tokenizer_sample_docs}


def corpus_tokenizer(
    opts, source, progress: dict | None, heldout: HeldoutChoice | None = None
) -> tuple[Tokenizer, str]:
    """(tokenizer, where it came from), saved into the output directory."""
    out = os.path.join(opts.output, TOKENIZER)
    if opts.tokenizer_path:
        tokenizer = load_tokenizer(opts.tokenizer_path)
        atomic_write(out, tokenizer.model_proto)
        origin = os.path.abspath(opts.tokenizer_path)
    elif progress and os.path.exists(out) and sha256_file(out) == progress["tokenizer_sha256"]:
        tokenizer = load_tokenizer(out)  # trained before the restart
        origin = progress["tokenizer_origin"]
    else:
        sample = training_sample(opts, source, heldout)
        if not sample:
            raise ValueError(f"empty corpus: no non-blank documents in {opts.input}")
        tokenizer = train_tokenizer(sample, opts.vocab_size, out)
        origin = (
            f"trained (vocab {opts.vocab_size}) on the first {len(sample):,} training documents"
        )
    if tokenizer.eos_id < 0:
        raise ValueError(f"tokenizer {tokenizer.path} has no eos piece to separate documents")
    return load_tokenizer(out), origin


def training_sample(opts, source, heldout: HeldoutChoice | None = None) -> list[str]:
    """The first `tokenizer_sample_docs` non-blank training documents in reading order."""
    heldout = heldout or heldout_choice(opts, source)
    sample, docs = [], 0
    for chunk in source.chunks(Position(), 1024):
        texts = chunk_texts(chunk, opts.text_field)
        lengths = np.array([1 if t.strip() else 0 for t in texts], np.int64)
        held = heldout.mask(chunk.first_record, lengths, docs)
        sample += [t for t, n, h in zip(texts, lengths, held, strict=True) if n and not h]
        docs += int(lengths.sum())
        if len(sample) >= opts.tokenizer_sample_docs:
            return sample[: opts.tokenizer_sample_docs]
    return sample
