"""Pieces every model family's parameter declaration shares."""

import flax.linen as nn

lecun = nn.initializers.lecun_normal()
zeros, ones = nn.initializers.zeros, nn.initializers.ones
small = nn.initializers.normal(stddev=0.02)  # embeddings and memory-read output (SPEC)


def nest(flat: dict) -> dict:
    """{'a/b': x} -> {'a': {'b': x}} (linen params are declared flat with '/' in the name)."""
    out: dict = {}
    for key, value in flat.items():
        *outer, leaf = key.split("/")
        node = out
        for k in outer:
            node = node.setdefault(k, {})
        node[leaf] = value
    return out
