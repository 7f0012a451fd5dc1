"""The pure training and evaluation steps.

`train_step(state, batch)` does one optimiser step: the loss and its gradient come from
`parallel.spmd.DataParallel` (one `jax.value_and_grad`, taken per device inside its
shard_map; on one device when no mesh is given). With gradient accumulation the global
batch (B, T) is split into `grad_accum` micro-batches scanned inside the step, so one call
is still one optimiser step, the loss is the mean over the whole batch, and the gradient is
exactly the full-batch gradient (equal-size micro-batches).

A step whose loss, gradient norm or updated state is not finite returns the previous state
unchanged, with `metrics['finite']` False (see `keep_if_finite`); the loop then stops.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from gpn_jax.models.base import document_starts, reset_after_eos
from gpn_jax.parallel import mesh as meshlib
from gpn_jax.parallel.spmd import DataParallel

Array = jax.Array


class TrainState(NamedTuple):
    step: Array  # int32 scalar: optimiser steps taken
    params: dict
    opt_state: optax.OptState
    rng: Array  # reserved for stochastic models; split per step, checkpointed for bit-exact resume
    # stateful training (`train.carry_state`): the model's carry of every batch row (stream),
    # the initial carry of the next step; None otherwise (an empty subtree: nothing saved)
    carry: Any = None


def init_train_state(model, optimizer, rng: Array, carry_rows: int = 0) -> TrainState:
    """Step 0; with `carry_rows` > 0 (stateful training) also the initial carry of that many
    streams."""
    init_rng, state_rng = jax.random.split(rng)
    params = model.init(init_rng)
    carry = model.init_state(carry_rows) if carry_rows else None
    return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params), state_rng, carry)


FINITE = "finite"  # metrics key: False when the step was rejected (see `keep_if_finite`)


def all_finite(tree) -> Array:
    """True iff every floating-point element of `tree` is finite (integer leaves always are)."""
    flags = [
        jnp.all(jnp.isfinite(x))
        for x in jax.tree.leaves(tree)
        if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)
    ]
    return jnp.all(jnp.stack(flags)) if flags else jnp.asarray(True)


def keep_if_finite(finite: Array, new: TrainState, old: TrainState) -> TrainState:
    """`new` if `finite`, else `old` unchanged (step counter included).

    Selected inside the jitted step, so a non-finite value never enters the state the loop
    holds: whatever a later (possibly asynchronous) checkpoint writes is finite by
    construction. The loop reads `metrics['finite']` and stops the run.
    """
    return jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)


def one_device_mesh() -> jax.sharding.Mesh:
    """data = fsdp = tensor = 1 on the default device: the plain step's mesh."""
    return meshlib.make_mesh({}, jax.devices()[:1])


def make_train_step(
    model,
    optimizer: optax.GradientTransformation,
    grad_accum: int = 1,
    eos_id: int | None = None,
    mesh: jax.sharding.Mesh | None = None,
    rules=None,
    loss_mask=None,
):
    """Returns the pure `train_step(state, batch) -> (state, metrics)`; jit it with donation.

    The loss and its gradient are `parallel.spmd.DataParallel`'s on `mesh` (None: one device),
    accumulated over `grad_accum` micro-batches; `loss_mask` (T,) bool restricts the loss to
    those positions (None: all). A state with a carry (stateful training) starts each row's
    window from it and keeps the final carry for the next step, reset at every document
    start: the positions after the separator `eos_id` inside the window, and the next
    window's first position when a row's window ends with it (`models.base`). eos_id None: no
    document resets."""
    dp = DataParallel(
        model, one_device_mesh() if mesh is None else mesh, rules, grad_accum, loss_mask
    )

    def train_step(state: TrainState, batch_BxT: Array):
        stateful = state.carry is not None
        resets = document_starts(batch_BxT, eos_id) if stateful and eos_id is not None else None
        dp.check_batch(batch_BxT)
        loss, grads, carry = dp.grad(state.params, batch_BxT, state.carry, resets)
        if stateful and eos_id is not None:
            carry = reset_after_eos(model, carry, batch_BxT, eos_id)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        rng, _ = jax.random.split(state.rng)
        grad_norm = optax.global_norm(grads)
        new = TrainState(state.step + 1, params, opt_state, rng, carry)
        finite = all_finite((loss, grad_norm, new))
        metrics = {"loss": loss, "grad_norm": grad_norm, FINITE: finite}
        return keep_if_finite(finite, new, state), metrics

    return train_step


def make_eval_step(model):
    """`eval_step(params, batch) -> (sum of CE, token count)` over all positions of the windows."""

    def eval_step(params, batch_BxT):
        ce_BxT, _ = model.token_losses(params, batch_BxT)
        return jnp.sum(ce_BxT), jnp.asarray(ce_BxT.size, jnp.float32)

    return eval_step
