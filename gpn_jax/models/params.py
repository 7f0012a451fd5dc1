"""Pieces every model family's parameter declaration shares."""

import flax.linen as nn

lecun = nn.initializers.lecun_normal()
zeros, ones = nn.initializers.zeros, nn.initializers.ones
small = nn.initializers.normal(stddev=0.02)  # embeddings and memory-read output (SPEC)


def swiglu_specs(d: int, f: int, down_init) -> dict:
    """{name: (init, shape)} of a SwiGLU block (`gpn_jax.core.mlp`): gate `w1` and up `w3`
    LeCun-normal (fan-in d, as one (d, 2f) matrix would be), down `w2` with `down_init`."""
    return {"w1": (lecun, (d, f)), "w3": (lecun, (d, f)), "w2": (down_init, (f, d))}


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
