"""Which of the Pallas kernels' passes the fused window calls (`model.kernels=pallas`): every
pass for one predict layer, with or without remat, in float32 or bfloat16 storage; the
forward's passes with two layers. The calls are counted as the window's gradient is traced
(no lowering needed: the passes run as Python while JAX traces)."""

import collections

import jax
import pytest

from gpn_jax import kernels
from gpn_jax.core.kernel_ops import MemoryKernels
from tests.helpers.window import pair, random_carry, tokens

PASSES = ("step", "stack", "grad")


def _counting(real: MemoryKernels, calls: collections.Counter) -> MemoryKernels:
    def wrap(name):
        def call(*args):
            calls[name] += 1
            return getattr(real, name)(*args)

        return call

    return real._replace(**{name: wrap(name) for name in PASSES})


def _trace_grad(model, params, x, carry) -> None:
    """Traces the loss gradient (`fused_grad_hlo`'s program, not lowered)."""
    jax.jit(jax.grad(lambda p: model.loss(p, x, carry)[0])).trace(params)


@pytest.mark.parametrize(
    "kw,used",
    [
        (dict(n_layers=1), set(PASSES)),
        (dict(n_layers=1, remat_segment=3), set(PASSES)),  # the forward reruns per segment
        (dict(n_layers=1, memory_dtype="bfloat16"), set(PASSES)),
        (dict(n_layers=2), {"step", "stack"}),  # the backward's passes take one layer's query
    ],
)
def test_which_passes_the_window_calls(kw, used, monkeypatch):
    model = pair(kernels="pallas", **kw)[1]
    real = kernels.resolve("pallas", "cpu", model.config.memory_dtype)
    calls = collections.Counter()
    monkeypatch.setattr(type(model), "kernels", lambda self: _counting(real, calls))
    params = model.init(jax.random.PRNGKey(0))
    _trace_grad(model, params, tokens(9), random_carry(model))
    assert set(calls) == used


@pytest.mark.parametrize("segment,T,parts", [(4, 8, 2), (3, 9, 1)])
def test_a_rerun_segment_builds_its_stack_in_halves(segment, T, parts, monkeypatch):
    """With remat and the kernels' backward, an even segment's backward runs in two halves,
    each with its own stack (one half's memories alive at a time): `stack` and `grad` are
    traced once per half; an odd segment keeps one part. The gradients are the window tests'
    (`tests/core/test_fused_window.py`, remat 4)."""
    model = pair(kernels="pallas", n_layers=1, remat_segment=segment)[1]
    real = kernels.resolve("pallas", "cpu", model.config.memory_dtype)
    calls = collections.Counter()
    monkeypatch.setattr(type(model), "kernels", lambda self: _counting(real, calls))
    params = model.init(jax.random.PRNGKey(0))
    _trace_grad(model, params, tokens(T), random_carry(model))
    assert calls["stack"] == parts and calls["grad"] == parts


def test_the_window_takes_kernels_per_shard_only():
    """Inside a shard_map manual over every axis of more than one device (the batch axes, as
    `parallel.spmd` maps) the kernels run per shard; with such an axis left to XLA's
    partitioner (jit over a sharded mesh) the window keeps its XLA formulas."""
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P

    from gpn_jax.core.fused import window as fused_window

    real = kernels.resolve("pallas", "cpu")
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]).reshape(2, 1), ("data", "tensor"))
    seen = {}

    def probe(where):
        def body(x):
            seen[where] = fused_window._usable_kernels(real, 1, True, jnp.float32, "float32")
            return x

        return body

    shard = jax.shard_map(
        probe("manual"), in_specs=P("data"), out_specs=P("data"), axis_names={"data"}
    )
    with jax.set_mesh(mesh):
        jax.jit(shard)(jnp.zeros(4))
        jax.jit(probe("auto"))(jnp.zeros(4))
    assert seen["manual"]["kernels"] is real and seen["auto"] == {}
