"""The pure training and evaluation steps.

`train_step(state, batch)` does one optimiser step. With gradient accumulation the global
batch (B, T) is split into `grad_accum` micro-batches scanned inside the step, so one call
is still one optimiser step, the loss is the mean over the whole batch, and the gradient is
exactly the full-batch gradient (equal-size micro-batches).

A step whose loss, gradient norm or updated state is not finite returns the previous state
unchanged, with `metrics['finite']` False (see `keep_if_finite`); the loop then stops.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gpn_jax.core.accumulate import accumulated_value_and_grad, accumulated_value_grad_and_aux
from gpn_jax.models.base import document_starts, reset_after_eos

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


class MaskedLoss:
    """`model` whose `loss` averages the CE over the positions where `mask_T` is True only.

    Why a wrapper: the mask is a property of the data layout (e.g. the answer positions of
    associative recall, the same in every window), so wrapping the model lets the plain and
    the sharded train steps use it unchanged. Everything else is the wrapped model's.
    """

    def __init__(self, model, mask_T):
        self.model, self.mask_1xT = model, np.asarray(mask_T, bool)[None, :]

    def __getattr__(self, name):
        return getattr(self.model, name)

    def loss(self, params, tokens_BxT, carry=None, **kw):
        return self.model.loss(params, tokens_BxT, carry, mask=self.mask_1xT, **kw)

    def partitioned(self, splits) -> "MaskedLoss":
        """The wrapped model's layout for `splits`, still masked."""
        return MaskedLoss(self.model.partitioned(splits), self.mask_1xT[0])


def with_loss_mask(model, mask_T):
    """`model` itself when `mask_T` is None, else a `MaskedLoss` over it."""
    return model if mask_T is None else MaskedLoss(model, mask_T)


def stateful_value_and_grad(model, params, batch_BxT, carry, resets_BxT, grad_accum: int = 1):
    """(loss, grads, final carry) of one window per stream from `carry` (truncated BPTT: no
    gradient reaches the incoming carry). A model that computes this itself (data-parallel,
    `parallel.spmd.ShardedModel`) does; else micro-batched here."""
    carry = jax.lax.stop_gradient(carry)
    if hasattr(model, "stateful_value_and_grad"):
        return model.stateful_value_and_grad(params, batch_BxT, carry, resets_BxT)

    def loss_fn(p, micro):
        tokens, c, r = micro
        loss, (new, _) = model.loss(p, tokens, c, resets=r)
        return loss, new

    batch = (batch_BxT, carry, resets_BxT)
    return accumulated_value_grad_and_aux(loss_fn, params, batch, grad_accum)


def make_train_step(
    model, optimizer: optax.GradientTransformation, grad_accum: int = 1, eos_id: int | None = None
):
    """Returns the pure `train_step(state, batch) -> (state, metrics)`; jit it with donation.

    A state with a carry (stateful training) starts each row's window from it and keeps the
    final carry for the next step, reset at every document start: the positions after the
    separator `eos_id` inside the window, and the next window's first position when a row's
    window ends with it (`models.base`). eos_id None: no document resets."""

    def accumulate(params, batch_BxT):
        loss_fn = lambda p, x: model.loss(p, x)[0]
        return accumulated_value_and_grad(loss_fn, params, batch_BxT, grad_accum)

    def stateful(params, batch_BxT, carry):
        resets = None if eos_id is None else document_starts(batch_BxT, eos_id)
        loss, grads, carry = stateful_value_and_grad(
            model, params, batch_BxT, carry, resets, grad_accum
        )
        if eos_id is not None:
            carry = reset_after_eos(model, carry, batch_BxT, eos_id)
        return loss, grads, carry

    def train_step(state: TrainState, batch_BxT: Array):
        carry = state.carry
        if carry is None:
            loss, grads = accumulate(state.params, batch_BxT)
        else:
            loss, grads, carry = stateful(state.params, batch_BxT, carry)
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
