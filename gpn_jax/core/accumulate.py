"""Gradient accumulation over equal micro-batches: a pure JAX transformation of a loss.

It lives in `core/` because both the plain train step (`training.train_step`) and the
data-parallel model (`parallel.spmd`, which accumulates inside its shard_map) use it, and
`parallel/` must not import `training/`.
"""

import jax
import jax.numpy as jnp


def micro_batches(batch_BxT: jax.Array, grad_accum: int) -> jax.Array:
    """(B, ...) -> (grad_accum, B / grad_accum, ...), or a one-line ValueError."""
    b = batch_BxT.shape[0]
    if b % grad_accum:
        raise ValueError(f"batch size {b} is not divisible by grad_accum {grad_accum}")
    return batch_BxT.reshape(grad_accum, b // grad_accum, *batch_BxT.shape[1:])


def accumulated_value_and_grad(loss_fn, params, batch_BxT: jax.Array, grad_accum: int = 1):
    """(loss, grads) of the scalar `loss_fn(params, batch)`, averaged over `grad_accum` equal
    micro-batches scanned in order (so the full-batch value and gradient, at a micro-batch's
    activation memory)."""
    grad_fn = jax.value_and_grad(loss_fn)
    if grad_accum == 1:
        return grad_fn(params, batch_BxT)

    def body(acc, micro):
        return jax.tree.map(jnp.add, acc, grad_fn(params, micro)), None

    zero = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
    total, _ = jax.lax.scan(body, zero, micro_batches(batch_BxT, grad_accum))
    return jax.tree.map(lambda x: x / grad_accum, total)


def accumulated_value_grad_and_aux(loss_fn, params, batch, grad_accum: int = 1):
    """(loss, grads, aux) of `loss_fn(params, batch) -> (scalar loss, aux)` where `batch` is a
    pytree of (B, ...) arrays and `aux` has a leading batch axis (stateful training: the final
    carry of every row). Averaged over `grad_accum` equal micro-batches as above; `aux` is the
    micro-batches' aux put back in row order."""
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if grad_accum == 1:
        (loss, aux), grads = grad_fn(params, batch)
        return loss, grads, aux

    def body(acc, micro):
        (loss, aux), grads = grad_fn(params, micro)
        return jax.tree.map(jnp.add, acc, (loss, grads)), aux

    zero = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
    micro = jax.tree.map(lambda x: micro_batches(x, grad_accum), batch)
    total, aux = jax.lax.scan(body, zero, micro)
    loss, grads = jax.tree.map(lambda x: x / grad_accum, total)
    return loss, grads, jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), aux)
