"""The pure training and evaluation steps.

`train_step(state, batch)` does one optimiser step. With gradient accumulation the global
batch (B, T) is split into `grad_accum` micro-batches scanned inside the step, so one call
is still one optimiser step, the loss is the mean over the whole batch, and the gradient is
exactly the full-batch gradient (equal-size micro-batches).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

Array = jax.Array


class TrainState(NamedTuple):
    step: Array  # int32 scalar: optimiser steps taken
    params: dict
    opt_state: optax.OptState
    rng: Array  # reserved for stochastic models; split per step, checkpointed for bit-exact resume


def init_train_state(model, optimizer, rng: Array) -> TrainState:
    init_rng, state_rng = jax.random.split(rng)
    params = model.init(init_rng)
    return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params), state_rng)


def _micro_batches(batch_BxT: Array, grad_accum: int) -> Array:
    b = batch_BxT.shape[0]
    if b % grad_accum:
        raise ValueError(f"batch size {b} is not divisible by grad_accum {grad_accum}")
    return batch_BxT.reshape(grad_accum, b // grad_accum, *batch_BxT.shape[1:])


def accumulated_value_and_grad(loss_fn, params, batch_BxT: Array, grad_accum: int = 1):
    """(loss, grads) of the scalar `loss_fn(params, batch)`, averaged over `grad_accum` equal
    micro-batches scanned in order (so the full-batch value and gradient, at a micro-batch's
    activation memory)."""
    grad_fn = jax.value_and_grad(loss_fn)
    if grad_accum == 1:
        return grad_fn(params, batch_BxT)

    def body(acc, micro):
        return jax.tree.map(jnp.add, acc, grad_fn(params, micro)), None

    zero = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
    total, _ = jax.lax.scan(body, zero, _micro_batches(batch_BxT, grad_accum))
    return jax.tree.map(lambda x: x / grad_accum, total)


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

    def loss(self, params, tokens_BxT, carry=None):
        return self.model.loss(params, tokens_BxT, carry, mask=self.mask_1xT)


def with_loss_mask(model, mask_T):
    """`model` itself when `mask_T` is None, else a `MaskedLoss` over it."""
    return model if mask_T is None else MaskedLoss(model, mask_T)


def make_train_step(model, optimizer: optax.GradientTransformation, grad_accum: int = 1):
    """Returns the pure `train_step(state, batch) -> (state, metrics)`; jit it with donation."""

    def accumulate(params, batch_BxT):
        loss_fn = lambda p, x: model.loss(p, x)[0]
        return accumulated_value_and_grad(loss_fn, params, batch_BxT, grad_accum)

    def train_step(state: TrainState, batch_BxT: Array):
        loss, grads = accumulate(state.params, batch_BxT)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        rng, _ = jax.random.split(state.rng)
        metrics = {"loss": loss, "grad_norm": optax.global_norm(grads)}
        return TrainState(state.step + 1, params, opt_state, rng), metrics

    return train_step


def make_eval_step(model):
    """`eval_step(params, batch) -> (sum of CE, token count)` over all positions of the windows."""

    def eval_step(params, batch_BxT):
        ce_BxT, _ = model.token_losses(params, batch_BxT)
        return jnp.sum(ce_BxT), jnp.asarray(ce_BxT.size, jnp.float32)

    return eval_step
