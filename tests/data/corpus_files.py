"""Helpers (not tests) that write small prepared corpora and caches by hand, so tests of the
untrusted-file checks can damage exactly one field or byte."""

import hashlib
import json
import os

import numpy as np

FORMAT = "gpn_jax.prepare/1"
TOKENIZER_BYTES = b"not a real tokenizer: read_prepared only names and hashes it"


def write_corpus(directory, dtype: str = "uint16", train=(40, 24), heldout=(16,), eos: int = 2):
    """A prepared corpus in `directory` with shards of the given token counts; returns its
    manifest (a dict, also written as manifest.json)."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(0)
    splits = {}
    for split, counts in (("train", train), ("heldout", heldout)):
        os.makedirs(os.path.join(directory, split), exist_ok=True)
        shards = []
        for i, n in enumerate(counts):
            name = f"{split}/data_{i:04d}.bin"
            rng.integers(0, 100, n).astype(dtype).tofile(os.path.join(directory, name))
            shards.append({"file": name, "tokens": n, "documents": 1})
        splits[split] = {"shards": shards, "tokens": sum(counts), "documents": len(counts)}
    with open(os.path.join(directory, "tokenizer.model"), "wb") as f:
        f.write(TOKENIZER_BYTES)
    manifest = {
        "format": FORMAT,
        "dtype": dtype,
        "splits": splits,
        "tokenizer": {
            "file": "tokenizer.model",
            "sha256": hashlib.sha256(TOKENIZER_BYTES).hexdigest(),
        },
        "document_separator": {"id": eos},
    }
    write_manifest(directory, manifest)
    return manifest


def write_manifest(directory, manifest) -> None:
    with open(os.path.join(directory, "manifest.json"), "w") as f:
        json.dump(manifest, f)
