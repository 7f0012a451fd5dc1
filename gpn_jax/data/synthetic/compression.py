"""MAD's compression task, in the causal form every family here can run.

MAD (Poli et al. 2024) encodes `seq_len - 1` random tokens and a compression token with the
model under test, then reconstructs every token from the compression token's output alone
with a small decoder. Our families are causal language models with no encoder-decoder split,
so here the compression token (id `vocab - 1`) is followed by `seq_len - 1` blanks (id
`vocab - 2`, an extra id) and at the i-th blank the answer is the i-th token: a recurrent
model must reconstruct the sequence from the state it held at the compression token.
Attention can still read the tokens back, so for Transformer++ this is plain copying
(`experiments/configs/synthetic_small.py` says so beside the task).
"""

import numpy as np

from gpn_jax.data.synthetic.examples import Examples, check_positive, rng


def compression(n, seq_len, vocab, seed, split) -> Examples:
    """`n` examples: `seq_len - 1` tokens from ids [0, vocab - 2), the compression token, then
    `seq_len - 1` blanks that carry the answers. Total length 2 seq_len - 1."""
    check_positive(n=n, seq_len=seq_len, vocab=vocab)
    if seq_len < 2 or vocab < 3:
        raise ValueError(f"compression needs seq_len >= 2 and vocab >= 3, got {seq_len}, {vocab}")
    r = rng(seed, split)
    m = seq_len - 1
    tokens = r.integers(0, vocab - 2, (n, m))
    inputs = np.concatenate(
        [tokens, np.full((n, 1), vocab - 1), np.full((n, m), vocab - 2)], axis=1
    ).astype(np.int32)
    labels = np.zeros_like(inputs)
    labels[:, m + 1 :] = tokens
    mask = np.zeros(inputs.shape, bool)
    mask[:, m + 1 :] = True
    return Examples(inputs, labels, mask)
