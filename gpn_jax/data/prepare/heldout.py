"""Which documents are held out: whole documents, chosen deterministically.

`--heldout_fraction=p`: record r is held out iff a 64-bit hash of (seed, r) falls in the
lowest p of its range, so the choice is spread over the whole corpus and depends on
nothing but the record number. `--heldout_docs=n`: the first n documents in reading order
(use it for corpora that are already shuffled, as FineWeb-Edu is).
"""

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def check_heldout(fraction: float, docs: int) -> None:
    """One-line errors for a bad held-out request."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"--heldout_fraction must be in [0, 1), got {fraction}")
    if docs < 0:
        raise ValueError(f"--heldout_docs must be >= 0, got {docs}")
    if fraction and docs:
        raise ValueError("give --heldout_fraction or --heldout_docs, not both")


def heldout_mask(
    first_record: int, lengths: np.ndarray, docs_before: int, fraction: float, docs: int, seed: int
) -> np.ndarray:
    """Bool per record of a chunk: held out? (`lengths` 0 marks blank records, not documents;
    `docs_before` counts the documents before the chunk.)"""
    if docs:
        is_doc = lengths > 0
        number = docs_before + np.cumsum(is_doc) - 1  # document number of each record
        return is_doc & (number < docs)
    if not fraction:
        return np.zeros(lengths.shape, bool)
    records = np.arange(first_record, first_record + len(lengths), dtype=np.uint64)
    with np.errstate(over="ignore"):
        keyed = records ^ (np.uint64(seed) * _GOLDEN)
    return _splitmix64(keyed) < np.uint64(int(fraction * 2.0**64))
