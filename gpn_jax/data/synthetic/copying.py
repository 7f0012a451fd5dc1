"""MAD's selective copying (Poli et al. 2024; after Gu and Dao's selective copying).

`n_copy` tokens drawn from the first `vocab - 2` ids are scattered, in order, among blanks
(id `vocab - 2`) over the first `seq_len - n_copy - 1` positions; then a copy token
(id `vocab - 1`) and `n_copy` more blanks. At the i-th trailing blank the answer is the i-th
scattered token: the model must have kept the non-blank tokens, in order, and skipped the blanks.
"""

import numpy as np

from gpn_jax.data.synthetic.examples import Examples, check_positive, rng


def selective_copying(n, seq_len, vocab, seed, split, n_copy=16) -> Examples:
    """`n` examples of selective copying, `seq_len` tokens each."""
    check_positive(n=n, seq_len=seq_len, vocab=vocab, n_copy=n_copy)
    if seq_len <= 2 * n_copy + 1 or vocab < 3:
        raise ValueError(
            f"selective copying needs seq_len > 2 n_copy + 1 = {2 * n_copy + 1} and vocab >= 3, "
            f"got {seq_len} and {vocab}"
        )
    r = rng(seed, split)
    blank, copy = vocab - 2, vocab - 1
    body = seq_len - n_copy - 1
    to_copy = r.integers(0, vocab - 2, (n, n_copy))
    # the positions of the tokens to copy: a sorted random subset of the body
    where = np.sort(np.argsort(r.random((n, body)), axis=1)[:, :n_copy], axis=1)
    inputs = np.full((n, seq_len), blank, np.int32)
    np.put_along_axis(inputs, where, to_copy, axis=1)
    inputs[:, body] = copy
    labels = np.zeros((n, seq_len), np.int32)
    labels[:, body + 1 :] = to_copy
    mask = np.zeros((n, seq_len), bool)
    mask[:, body + 1 :] = True
    return Examples(inputs, labels, mask)
