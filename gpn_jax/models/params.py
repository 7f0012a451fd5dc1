"""Parameter declaration every model family shares: one `ParamSpec` per parameter.

A family writes `param_specs(config)`, a nested dict of `ParamSpec(init, shape, axes)`; from
it come the initial values (`init_params`, through Flax linen, which returns the plain
nested dict the pure code, orbax and optax consume) and the logical axes the sharding code
maps to the device mesh (`flat_axes`; see `gpn_jax.parallel.sharding`). So a family's
module alone says what its parameters are and how each dimension may be split.

Logical axis names (one per dimension; None: that dimension is never split):

* `embed`: a model-width dimension (d_model, d_emb) - a matrix's storage split (fsdp);
* `vocab`: the vocabulary (embedding rows, LM head columns);
* `ffn`: the SwiGLU hidden width;
* `heads`: a dimension made of whole heads (H, H*K or H*U columns / rows).

`axis_sizes` of a model says which model size each logical axis must split evenly (heads
whole, d_ffn evenly), so a mesh that would cut a head is not used for that axis.
"""

import math
from collections.abc import Callable
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

lecun = nn.initializers.lecun_normal()
zeros, ones = nn.initializers.zeros, nn.initializers.ones
small = nn.initializers.normal(stddev=0.02)  # embeddings and memory-read output (as the paper)

EMBED, VOCAB, FFN, HEADS = "embed", "vocab", "ffn", "heads"


# the gated delta rule's decay (GPN+M's memory write and Gated DeltaNet's, as Mamba2's)
def a_log_init(key, shape, dtype=jnp.float32):
    """A_log = log(U(0, 16)), guarded against log(0)."""
    return jnp.log(jnp.maximum(jax.random.uniform(key, shape, dtype, 0.0, 16.0), 1e-8))


def dt_bias_init(key, shape, dtype=jnp.float32):
    """softplus^-1(dt), dt = exp(U(log 1e-3, log 1e-1)) clipped at 1e-4."""
    u = jax.random.uniform(key, shape, dtype, math.log(1e-3), math.log(1e-1))
    dt = jnp.maximum(jnp.exp(u), 1e-4)
    return dt + jnp.log(-jnp.expm1(-dt))


class ParamSpec(NamedTuple):
    """One parameter: initialiser `init(key, shape)`, shape, logical axis name per dimension."""

    init: Callable
    shape: tuple
    axes: tuple


def param(init, shape, axes=None) -> ParamSpec:
    """A `ParamSpec`; `axes` None: no dimension is ever split (norm weights, biases)."""
    axes = (None,) * len(shape) if axes is None else tuple(axes)
    if len(axes) != len(shape):
        raise ValueError(f"{len(axes)} logical axes {axes} for a parameter of shape {shape}")
    return ParamSpec(init, tuple(shape), axes)


def swiglu_specs(d: int, f: int, down_init) -> dict:
    """Specs of a SwiGLU block (`gpn_jax.core.mlp`): gate `w1` and up `w3` LeCun-normal (fan-in
    d, as one (d, 2f) matrix would be) and column-parallel, down `w2` row-parallel."""
    return {
        "w1": param(lecun, (d, f), (EMBED, FFN)),
        "w3": param(lecun, (d, f), (EMBED, FFN)),
        "w2": param(down_init, (f, d), (FFN, EMBED)),
    }


def flatten(specs: dict, prefix: str = "") -> dict:
    """{'a': {'b': spec}} -> {'a/b': spec}, in declaration order."""
    out = {}
    for key, value in specs.items():
        name = f"{prefix}{key}"
        out |= flatten(value, name + "/") if isinstance(value, dict) else {name: value}
    return out


def flat_axes(specs: dict) -> dict:
    """{'layer_0/w1': ('embed', 'ffn'), ...}: what `model.param_axes()` returns."""
    return {name: s.axes for name, s in flatten(specs).items()}


class _Declare(nn.Module):
    """Declares flat ('a/b'-named) parameters in order; `__call__` only returns them."""

    flat: tuple  # ((name, init, shape), ...)

    @nn.compact
    def __call__(self):
        return {name: self.param(name, init, shape) for name, init, shape in self.flat}


def init_params(specs: dict, rng) -> dict:
    """Initial values of `specs` as a nested dict (each leaf drawn from `rng` by linen)."""
    flat = tuple((name, s.init, s.shape) for name, s in flatten(specs).items())
    return nest(dict(_Declare(flat).init(rng)["params"]))


def nest(flat: dict, sep: str = "/") -> dict:
    """{'a/b': x} -> {'a': {'b': x}} (linen params are declared flat with '/' in the name)."""
    out: dict = {}
    for key, value in flat.items():
        *outer, leaf = key.split(sep)
        node = out
        for k in outer:
            node = node.setdefault(k, {})
        node[leaf] = value
    return out
