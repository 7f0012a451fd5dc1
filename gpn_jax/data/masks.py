"""The training loss's positions, known from the config alone: a module of its own, so that
building a train step (`training.setup`) imports none of the data pipeline (grain)."""

import numpy as np

from gpn_jax.data.spec import parse_spec


def loss_mask(config) -> np.ndarray | None:
    """(seq_len,) bool: the positions the training loss of `config`'s data is taken on (the
    answers of `recall:` data with targets=answers), or None for every position. Known from
    the config alone, so the train step can be built before the data."""
    source = parse_spec(config.data.source)
    if source.kind != "recall":
        return None
    from gpn_jax.data import recall

    return recall.loss_mask(recall.parse_recall_params(source.name), config.train.seq_len)
