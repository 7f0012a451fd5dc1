"""State tracking: parity, modular addition and the S5 word problem (Merrill et al. 2024,
"The Illusion of State in State-Space Models"; Grazzi et al. 2024, "Unlocking State-Tracking in
Linear RNNs Through Negative Eigenvalues").

Inputs are group elements only: bits (parity), residues 0..m-1 (addition mod m), or the 120
permutations of five items (S5, ids in `permutations(5)` order). The label at every position is
the running product of the inputs so far: the parity, the sum mod m, or the composed
permutation. The running state never enters the input stream, so no position can be answered
from the last token or two (`leak_score` measures exactly that).
"""

import functools
import itertools

import numpy as np

from gpn_jax.data.synthetic.examples import Examples, check_positive, rng


@functools.lru_cache(maxsize=1)
def s5_elements() -> np.ndarray:
    """(120, 5) every permutation of 0..4, in lexicographic order (id = row)."""
    return np.array(list(itertools.permutations(range(5))), np.int64)


@functools.lru_cache(maxsize=1)
def s5_table() -> np.ndarray:
    """(120, 120) table[a, b]: the id of 'apply a, then b' (b after a)."""
    perms = s5_elements()
    index = {tuple(p): i for i, p in enumerate(perms)}
    return np.array([[index[tuple(b[a])] for b in perms] for a in perms], np.int64)


def _running(inputs: np.ndarray, combine) -> np.ndarray:
    state = np.zeros(inputs.shape, np.int64)
    acc = inputs[:, 0]
    state[:, 0] = acc
    for t in range(1, inputs.shape[1]):
        acc = combine(acc, inputs[:, t])
        state[:, t] = acc
    return state


def _examples(inputs: np.ndarray, labels: np.ndarray) -> Examples:
    return Examples(inputs.astype(np.int32), labels.astype(np.int32), np.ones(inputs.shape, bool))


def parity(n, seq_len, vocab, seed, split) -> Examples:
    """Random bits; label: the parity of the bits so far. `vocab` must be 2."""
    if vocab != 2:
        raise ValueError(f"parity has two symbols (vocab 2), got vocab {vocab}")
    return modular_addition(n, seq_len, vocab, seed, split)


def modular_addition(n, seq_len, vocab, seed, split) -> Examples:
    """Random residues mod `vocab`; label: their running sum mod `vocab`."""
    check_positive(n=n, seq_len=seq_len, vocab=vocab)
    if vocab < 2:
        raise ValueError(f"modular addition needs a modulus (vocab) >= 2, got {vocab}")
    x = rng(seed, split, seq_len).integers(0, vocab, (n, seq_len))
    return _examples(x, np.cumsum(x, axis=1) % vocab)


def s5(n, seq_len, vocab, seed, split) -> Examples:
    """Random permutations of 5 items; label: their composition so far. `vocab` must be 120."""
    check_positive(n=n, seq_len=seq_len)
    if vocab != 120:
        raise ValueError(f"s5 has exactly 120 elements (vocab 120), got vocab {vocab}")
    x = rng(seed, split, seq_len).integers(0, 120, (n, seq_len))
    table = s5_table()
    return _examples(x, _running(x, lambda a, b: table[a, b]))


def _context_keys(ex: Examples, context: int, base: int):
    """(keys, labels) of the positions t >= context (whose prefix is longer than the context):
    each key encodes inputs[t-context+1..t]."""
    x = np.asarray(ex.inputs, np.int64)
    T = x.shape[1]
    key = np.zeros((x.shape[0], T - context), np.int64)
    for lag in range(context):
        key = key * base + x[:, context - lag : T - lag]
    mask = np.asarray(ex.mask)[:, context:]
    return key[mask], np.asarray(ex.labels, np.int64)[:, context:][mask]


def leak_score(fit: Examples, held: Examples, context: int = 2) -> float:
    """Held-out accuracy of the majority-label lookup table from the last `context` inputs to
    the label, fitted on `fit` and scored on `held` (positions with a full context only).
    Near chance when the state stays out of the stream; near 1 when a format writes the state
    (or the answer) into the inputs."""
    base = int(max(fit.inputs.max(), held.inputs.max())) + 1
    keys, labels = _context_keys(fit, context, base)
    (k, lab), counts = np.unique(np.stack([keys, labels]), axis=1, return_counts=True)
    order = np.lexsort((-counts, k))  # per key, the most frequent label first
    first = np.unique(k[order], return_index=True)[1]
    table = dict(zip(k[order][first].tolist(), lab[order][first].tolist(), strict=True))
    hk, hl = _context_keys(held, context, base)
    guess = np.array([table.get(key, -1) for key in hk.tolist()])
    return float((guess == hl).mean())
