"""Gradient accumulation over equal micro-batches: the value and gradient of a model's loss.

It lives in `core/` because the data-parallel gradient (`parallel.spmd`, which accumulates
inside its shard_map) uses it and is below `training/`; it is the only place a train step
takes `jax.value_and_grad`.
"""

import jax
import jax.numpy as jnp


def micro_batches(batch_BxT: jax.Array, grad_accum: int) -> jax.Array:
    """(B, ...) -> (grad_accum, B / grad_accum, ...), or a one-line ValueError."""
    b = batch_BxT.shape[0]
    if b % grad_accum:
        raise ValueError(f"batch size {b} is not divisible by grad_accum {grad_accum}")
    return batch_BxT.reshape(grad_accum, b // grad_accum, *batch_BxT.shape[1:])


def accumulated_value_and_grad(loss_fn, params, tokens_BxT, carry=None, kw=None, grad_accum=1):
    """(loss, grads, final carry) of a model loss `loss_fn(params, tokens, carry, **kw) ->
    (loss, (carry, metrics))` (the `models.base.LanguageModel.loss` contract), averaged over
    `grad_accum` equal micro-batches scanned in order: the full-batch value and gradient at a
    micro-batch's activation memory. `carry` and the (B, ...) leaves of `kw` (e.g. `resets`)
    are split with the rows; the final carry comes back in row order, or None when `carry` is
    None (fresh windows: nothing to carry on). Gradients are taken in `params` only."""
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    kw = kw or {}
    if grad_accum == 1:
        (loss, (new, _)), grads = grad_fn(params, tokens_BxT, carry, **kw)
        return loss, grads, None if carry is None else new

    def body(acc, micro):
        x, c, k = micro
        (loss, (new, _)), grads = grad_fn(params, x, c, **k)
        return jax.tree.map(jnp.add, acc, (loss, grads)), None if c is None else new

    zero = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
    micro = jax.tree.map(lambda x: micro_batches(x, grad_accum), (tokens_BxT, carry, kw))
    total, new = jax.lax.scan(body, zero, micro)
    loss, grads = jax.tree.map(lambda x: x / grad_accum, total)
    return loss, grads, jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), new)
