"""Documents -> one flat uint32 token stream (eos after every document), optionally cached."""

import hashlib
from collections.abc import Sequence

import numpy as np

from gpn_jax.data.tokenizer import Tokenizer
from gpn_jax.io import paths
from gpn_jax.io.files import load_cache, save_cache
from gpn_jax.io.untrusted import bad_file

_ENCODE_BATCH = 512


def tokenize_documents(docs: Sequence[str], tokenizer: Tokenizer) -> np.ndarray:
    """Concatenated token ids of `docs`, each followed by `tokenizer.eos_id`, as uint32."""
    eos = np.array([tokenizer.eos_id], np.uint32)
    parts = []
    for lo in range(0, len(docs), _ENCODE_BATCH):
        for ids in tokenizer.encode_batch(docs[lo : lo + _ENCODE_BATCH]):
            parts += [np.asarray(ids, np.uint32), eos]
    return np.concatenate(parts) if parts else np.zeros((0,), np.uint32)


def stream_key(docs: Sequence[str], tokenizer: Tokenizer) -> str:
    """A content hash of (tokenizer model, documents) naming a cached stream."""
    h = hashlib.sha256(tokenizer.model_proto)
    for doc in docs:
        h.update(doc.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:20]


def cached_token_stream(
    docs: Sequence[str], tokenizer: Tokenizer, cache_dir: str | None, name: str
) -> np.ndarray:
    """`tokenize_documents`, loaded from / saved to `<cache_dir>/<name>-<key>.npy` if given."""
    if not cache_dir:
        return tokenize_documents(docs, tokenizer)
    path = paths.join(cache_dir, f"{name}-{stream_key(docs, tokenizer)}.npy")

    def in_vocabulary(tokens) -> None:  # every load: a cache is trusted for nothing
        top = int(tokens.max()) if len(tokens) else -1
        if top >= tokenizer.vocab_size:
            raise bad_file(
                path, f"token id {top} >= the tokenizer's vocabulary {tokenizer.vocab_size}",
                "delete this cache file (it is rebuilt on the next run)",
            )  # fmt: skip

    tokens = load_cache(path, "uint32", check=in_vocabulary)
    if tokens is None:
        tokens = tokenize_documents(docs, tokenizer)
        save_cache(path, tokens)
    return tokens


def unigram_counts(tokens, vocab_size: int, chunk: int = 1 << 24) -> np.ndarray:
    """Counts (int64, size `vocab_size`) of each id in `tokens`, read `chunk` at a time.

    Raises ValueError if an id is >= `vocab_size`.
    """
    counts = np.zeros((vocab_size,), np.int64)
    for lo in range(0, len(tokens), chunk):
        part = np.asarray(tokens[lo : lo + chunk])
        if part.size and int(part.max()) >= vocab_size:
            raise ValueError(
                f"token id {int(part.max())} >= vocab_size {vocab_size}; "
                "vocab_size must exceed the largest token id"
            )
        counts += np.bincount(part, minlength=vocab_size)
    return counts
