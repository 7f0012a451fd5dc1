"""Data pipeline: text / tfds / pre-tokenised sources -> tokenizer -> resumable windows (Grain).

The names below load on first use (PEP 562): `prepare`'s tokenizing workers import
`gpn_jax.data.tokenizer`, and an eager package `__init__` would make each of them import JAX
and Grain first (seconds per worker; the tokenizer alone loads in a fraction of that).
"""

import importlib

_EXPORTS = {
    "Data": "gpn_jax.data.pipeline",
    "DataConfig": "gpn_jax.data.pipeline",
    "ShardedTokens": "gpn_jax.data.bin_source",
    "Source": "gpn_jax.data.pipeline",
    "SourceSpec": "gpn_jax.data.spec",
    "Tokenizer": "gpn_jax.data.tokenizer",
    "WindowIterator": "gpn_jax.data.windows",
    "WindowSource": "gpn_jax.data.windows",
    "build": "gpn_jax.data.pipeline",
    "build_data": "gpn_jax.data.pipeline",
    "check_vocab": "gpn_jax.data.tokenizer",
    "embedded_corpus": "gpn_jax.data.text_sources",
    "from_config": "gpn_jax.data.pipeline",
    "iter_jsonl_file": "gpn_jax.data.text_sources",
    "iter_path_documents": "gpn_jax.data.text_sources",
    "iter_tfds_documents": "gpn_jax.data.tfds_source",
    "load_tokenizer": "gpn_jax.data.tokenizer",
    "loss_mask": "gpn_jax.data.masks",
    "open_bin": "gpn_jax.data.bin_source",
    "parse_spec": "gpn_jax.data.spec",
    "read": "gpn_jax.data.pipeline",
    "split_documents": "gpn_jax.data.split",
    "split_tokens": "gpn_jax.data.split",
    "tokenize_documents": "gpn_jax.data.stream",
    "train_tokenizer": "gpn_jax.data.tokenizer",
    "unigram_counts": "gpn_jax.data.stream",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
