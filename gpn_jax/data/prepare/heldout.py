"""Which documents are held out: whole documents, chosen deterministically.

`--heldout_fraction=p`: record r is held out iff a 64-bit hash of (seed, r) falls in the
lowest p of its range, so the choice is spread over the whole corpus and depends on
nothing but the record number. `--heldout_docs=n`: the first n documents in reading order
(use it for corpora that are already shuffled, as FineWeb-Edu is).

`--heldout_stratified` (with a fraction): one document out of every 1/p consecutive ones in
order of difficulty, so the held-out split is exactly as hard as the training split. On a
small, heterogeneous corpus a hash choice is not: which documents it draws moves held-out
PPL against train PPL by several per cent whatever the model (see `stratified_records`).
"""

import collections
import dataclasses
import math
import re

import numpy as np

from gpn_jax.data.prepare.encode import chunk_texts
from gpn_jax.data.prepare.inputs import Position

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_WORD = re.compile(r"\w+|[^\w\s]")  # words and single punctuation marks
_READ_CHUNK = 1024  # records per chunk of the difficulty passes


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _keyed_hash(values: np.ndarray, seed: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        return _splitmix64(values.astype(np.uint64) ^ (np.uint64(seed) * _GOLDEN))


def check_heldout(fraction: float, docs: int, stratified: bool = False) -> None:
    """One-line errors for a bad held-out request."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"--heldout_fraction must be in [0, 1), got {fraction}")
    if docs < 0:
        raise ValueError(f"--heldout_docs must be >= 0, got {docs}")
    if fraction and docs:
        raise ValueError("give --heldout_fraction or --heldout_docs, not both")
    if stratified and not fraction:
        raise ValueError("--heldout_stratified needs --heldout_fraction > 0")


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
    return _keyed_hash(records, seed) < np.uint64(int(fraction * 2.0**64))


@dataclasses.dataclass(frozen=True)
class HeldoutChoice:
    """The held-out choice of one `prepare` run: `mask` per chunk, whichever rule it uses."""

    fraction: float
    docs: int
    seed: int
    records: np.ndarray | None = None  # sorted held-out record numbers (stratified only)

    def mask(self, first_record: int, lengths: np.ndarray, docs_before: int) -> np.ndarray:
        if self.records is None:
            return heldout_mask(
                first_record, lengths, docs_before, self.fraction, self.docs, self.seed
            )
        numbers = np.arange(first_record, first_record + len(lengths))
        return np.isin(numbers, self.records) & (lengths > 0)


def heldout_choice(opts, source) -> HeldoutChoice:
    """The choice `opts` asks for; the stratified one reads the corpus twice first."""
    records = None
    if opts.heldout_stratified:
        numbers, difficulty = document_difficulty(source, opts.text_field)
        records = stratified_records(numbers, difficulty, opts.heldout_fraction, opts.seed)
    return HeldoutChoice(opts.heldout_fraction, opts.heldout_docs, opts.seed, records)


def _record_texts(source, text_field: str):
    """(record number, text) of every non-blank record, in reading order."""
    for chunk in source.chunks(Position(), _READ_CHUNK):
        for i, text in enumerate(chunk_texts(chunk, text_field)):
            if text.strip():
                yield chunk.first_record + i, text


def document_difficulty(source, text_field: str) -> tuple[np.ndarray, np.ndarray]:
    """(record numbers, difficulty) of the documents: each one's mean surprisal per word (nats)
    under the add-one word-unigram model of all the other documents (words and punctuation
    marks): how hard it is for a model that has not read it, novel words included, which is
    what a held-out document is. Tokenizer-free, so it can run before the tokenizer is trained
    on the training split. Two passes over the text, with the word counts in memory (an option
    for corpora of up to a few GB)."""
    counts = collections.Counter()
    for _, text in _record_texts(source, text_field):
        counts.update(_WORD.findall(text))
    total, vocab = sum(counts.values()), len(counts) + 1  # + 1: the unseen word
    numbers, difficulty = [], []
    for record, text in _record_texts(source, text_field):
        words = _WORD.findall(text)  # not empty: the text has a non-space character
        own = collections.Counter(words)
        log_p = math.fsum(k * math.log(counts[w] - k + 1) for w, k in own.items())
        numbers.append(record)
        difficulty.append(math.log(total - len(words) + vocab) - log_p / len(words))
    return np.array(numbers, np.int64), np.array(difficulty, np.float64)


def stratified_records(
    numbers: np.ndarray, difficulty: np.ndarray, fraction: float, seed: int
) -> np.ndarray:
    """Sorted record numbers of the held-out documents. With the documents ranked by difficulty
    (ties by record number), stratum k holds the ranks [ceil(k/p), ceil((k+1)/p)) (1/p of them,
    rounded) and gives one, at a place drawn from a hash of (seed, k); the last stratum, cut
    short by the end of the ranking, gives none if the place falls past it, so every document
    is held out with probability p (when 1/p is an integer; else 1/p rounded up or down,
    its stratum's share). The held-out documents spread over every level of
    difficulty as the training documents do."""
    order = np.lexsort((numbers, difficulty))
    strata = np.arange(math.ceil(len(order) * fraction), dtype=np.uint64)
    lo, hi = (stratum_starts(strata + np.uint64(i), fraction) for i in (0, 1))
    u = (_keyed_hash(strata, seed) >> np.uint64(11)).astype(np.float64) / 2.0**53  # [0, 1)
    ranks = (lo + np.floor(u * (hi - lo))).astype(np.int64)
    ranks = ranks[ranks < len(order)]
    return np.sort(numbers[order[ranks]])


def stratum_starts(strata: np.ndarray, fraction: float) -> np.ndarray:
    """First rank of each stratum, ceil(k/p) (k/p rounded to 1e-6 first, so that 20/0.05 is
    20 and not 21)."""
    return np.ceil(np.round(strata.astype(np.float64) / fraction, 6))
