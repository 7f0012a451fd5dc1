"""Zoology's multi-query associative recall (Arora et al. 2023) as labelled examples.

The sequence layout and its generator are `gpn_jax.data.recall` (N key-value pairs, then
queries of every key, each followed by its value); here its ids are shifted down to start at 0
(keys [0, keys), values [keys, keys + values)), padding becomes the extra id keys + values,
and each answer becomes the label of the query position that predicts it.

By default every key is queried once (Zoology's protocol): the first `pairs` queries, one per
key in a random order, follow the pairs and the rest of the sequence is padding.
`repeat_queries=True` fills the sequence with queries instead (each key 3-7 times at T = 64
with 8 pairs), as the quick and small suites were run.
"""

import numpy as np

from gpn_jax.data import recall as recall_data
from gpn_jax.data.synthetic.examples import SPLITS, Examples, check_positive, from_next_token


def mqar(n, seq_len, vocab, seed, split, pairs=8, repeat_queries=False) -> Examples:
    """`n` MQAR examples with `pairs` pairs; `vocab` = keys + values + 1 (pad), keys = values."""
    check_positive(n=n, seq_len=seq_len, vocab=vocab, pairs=pairs)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {sorted(SPLITS)}")
    if not repeat_queries and seq_len < 4 * pairs:
        raise ValueError(
            f"MQAR queries every key once: seq_len must be >= 4 x pairs = {4 * pairs}, got {seq_len}"
        )
    keys = (vocab - 1) // 2
    spec = recall_data.RecallSpec(pairs=pairs, keys=keys, values=keys, examples=0, seed=seed)
    tokens, answers = recall_data.make_examples(spec, n, seq_len, stream=(3, SPLITS[split]))
    if not repeat_queries:  # the first `pairs` queries ask every key once; pad the rest
        tokens[:, 4 * pairs :] = recall_data.PAD
        answers[:, 4 * pairs :] = False
    pad = tokens == recall_data.PAD
    tokens = np.where(pad, 2 * keys, tokens.astype(np.int64) - recall_data.FIRST_KEY)
    return from_next_token(tokens, answers)
