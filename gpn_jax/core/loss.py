"""The one chunked cross-entropy every model family decodes its loss with.

A family hands over its hidden states time-major (T, B, D) and a `logits_fn` mapping a
(chunk, B, D) slice to (chunk, B, V) float32 logits (GPN: `core.gpn.decode`; Transformer++
and Gated DeltaNet: the LM head). The states are decoded `chunk` time steps at a time and
each chunk is rematerialised, so neither the forward nor the backward pass ever holds more
than (chunk, B, V) logits. GPN's fused path (`core.fused.loss.cross_entropy_sum_fused`)
computes the same sum with its gradients in the forward pass, chunked by `chunk_size`.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

Array = jax.Array
LogitsFn = Callable[[Array], Array]


def chunk_size(T: int, chunk: int) -> int:
    """The largest divisor of T not above `chunk` (0 or >= T means one chunk)."""
    if not chunk or chunk >= T:
        return T
    return max(c for c in range(1, chunk + 1) if T % c == 0)


def _chunks(x: Array, chunk: int) -> Array:
    return x.reshape(x.shape[0] // chunk, chunk, *x.shape[1:])


def _scan_chunks(logits_fn: LogitsFn, h_TxBxD: Array, targets_TxB: Array, chunk: int, body):
    c = chunk_size(h_TxBxD.shape[0], chunk)

    @jax.checkpoint
    def chunk_ce(h, x):
        return optax.softmax_cross_entropy_with_integer_labels(logits_fn(h), x)

    xs = (_chunks(h_TxBxD, c), _chunks(targets_TxB, c))
    return body(chunk_ce, xs)


def cross_entropy_sum(
    logits_fn: LogitsFn, h_TxBxD: Array, targets_TxB: Array, chunk: int = 0
) -> Array:
    """Sum over all (T, B) positions of CE(logits_fn(h_t), x_t), float32 scalar."""

    def body(chunk_ce, xs):
        step = lambda total, hx: (total + chunk_ce(*hx).sum(), None)
        return jax.lax.scan(step, jnp.zeros((), jnp.float32), xs)[0]

    return _scan_chunks(logits_fn, h_TxBxD, targets_TxB, chunk, body)


def per_token_cross_entropy(
    logits_fn: LogitsFn, h_TxBxD: Array, targets_TxB: Array, chunk: int = 0
) -> Array:
    """CE of every position, (T, B) float32 (evaluation, analyses)."""

    def body(chunk_ce, xs):
        return jax.lax.scan(lambda _, hx: (None, chunk_ce(*hx)), None, xs)[1]

    return _scan_chunks(logits_fn, h_TxBxD, targets_TxB, chunk, body).reshape(targets_TxB.shape)
