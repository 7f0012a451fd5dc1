"""MAD's memorisation task (Poli et al. 2024): a fixed key -> value map learnt in the weights.

One map for the whole task (drawn from the task seed, the same for every split): keys are the
lower half of ids [0, vocab - 1), values the upper half, paired by a random permutation.
An example is `k insert k insert ...` (insert token: id `vocab - 1`); at each insert the
answer is the value of the key before it. The value never appears in the input, so nothing
in context gives it away: only what the training set wrote into the parameters does.
"""

import numpy as np

from gpn_jax.data.synthetic.examples import Examples, check_positive, rng


def key_value_map(vocab: int, seed: int) -> np.ndarray:
    """(n_keys,) the value id of each key id (a bijection onto part of the upper half)."""
    n_keys = (vocab - 1) // 2
    r = np.random.default_rng([seed, 99])  # its own stream: shared by every split
    return n_keys + r.permutation(vocab - 1 - n_keys)[:n_keys]


def memorisation(n, seq_len, vocab, seed, split) -> Examples:
    """`n` examples of `seq_len` (even) tokens, `seq_len / 2` queries of the fixed map each."""
    check_positive(n=n, seq_len=seq_len, vocab=vocab)
    if seq_len % 2 or vocab < 3:
        raise ValueError(f"memorisation needs an even seq_len and vocab >= 3, got {seq_len}")
    table = key_value_map(vocab, seed)
    keys = rng(seed, split).integers(0, len(table), (n, seq_len // 2))
    inputs = np.full((n, seq_len), vocab - 1, np.int32)
    inputs[:, 0::2] = keys
    labels = np.zeros((n, seq_len), np.int32)
    labels[:, 1::2] = table[keys]
    mask = np.zeros((n, seq_len), bool)
    mask[:, 1::2] = True
    return Examples(inputs, labels, mask)
