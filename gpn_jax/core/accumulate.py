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
