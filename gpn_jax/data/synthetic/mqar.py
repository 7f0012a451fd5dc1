"""Zoology's multi-query associative recall (Arora et al. 2023) as labelled examples.

The sequence layout and its generator are `gpn_jax.data.recall` (N key-value pairs, then
queries of every key, each followed by its value); here its ids are shifted down to start at 0
(keys [0, keys), values [keys, keys + values)), padding becomes the extra id keys + values,
and each answer becomes the label of the query position that predicts it.
"""

import numpy as np

from gpn_jax.data import recall as recall_data
from gpn_jax.data.synthetic.examples import SPLITS, Examples, check_positive, from_next_token


def mqar(n, seq_len, vocab, seed, split, pairs=8) -> Examples:
    """`n` MQAR examples with `pairs` pairs; `vocab` = keys + values + 1 (pad), keys = values."""
    check_positive(n=n, seq_len=seq_len, vocab=vocab, pairs=pairs)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {sorted(SPLITS)}")
    keys = (vocab - 1) // 2
    spec = recall_data.RecallSpec(pairs=pairs, keys=keys, values=keys, examples=0, seed=seed)
    tokens, answers = recall_data.make_examples(spec, n, seq_len, stream=(3, SPLITS[split]))
    pad = tokens == recall_data.PAD
    tokens = np.where(pad, 2 * keys, tokens.astype(np.int64) - recall_data.FIRST_KEY)
    return from_next_token(tokens, answers)
