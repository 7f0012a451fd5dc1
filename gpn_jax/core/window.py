"""Drives the GPN step over a window with `lax.scan`, and decodes after it.

Everything that does not depend on the recurrence stays out of the loop: the token-side
grounding projection is computed for all positions before the scan, and decode +
cross-entropy run after it on the stacked predicted states, chunked over time so the
(B, T, V) logits never exist at once (forward or backward).
"""

import jax
import jax.numpy as jnp
import optax

from gpn_jax.core import gpn
from gpn_jax.core.gpn import GPNCarry, Intervention, StepOutput

Array = jax.Array


def check_remat_segment(seq_len: int, remat_segment: int) -> None:
    if remat_segment and seq_len % remat_segment:
        raise ValueError(
            f"sequence length {seq_len} is not divisible by the remat segment {remat_segment}"
        )


def scan_window(
    params: gpn.Params,
    carry: GPNCarry,
    xg_TxBxD: Array,
    remat_segment: int = 0,
    iv: Intervention = Intervention(),
) -> tuple[GPNCarry, StepOutput]:
    """Runs `gpn.step` over T positions. Returns (final carry, StepOutput stacked to (T, B, ...)).

    With `remat_segment` = S > 0 the window is cut into T/S segments; each segment's
    activations are recomputed in the backward pass, so only segment-boundary carries are kept.
    """
    body = lambda c, xg: gpn.step(params, c, xg, iv)
    T = xg_TxBxD.shape[0]
    if not remat_segment or remat_segment >= T:
        return jax.lax.scan(body, carry, xg_TxBxD)
    check_remat_segment(T, remat_segment)
    segments = xg_TxBxD.reshape(T // remat_segment, remat_segment, *xg_TxBxD.shape[1:])

    @jax.checkpoint
    def segment(c, xg_seg):
        return jax.lax.scan(body, c, xg_seg)

    carry, out = jax.lax.scan(segment, carry, segments)
    return carry, jax.tree.map(lambda x: x.reshape(T, *x.shape[2:]), out)


def _chunks(x: Array, chunk: int) -> Array:
    return x.reshape(x.shape[0] // chunk, chunk, *x.shape[1:])


def chunk_size(T: int, chunk: int) -> int:
    """The largest divisor of T not above `chunk` (0 or >= T means one chunk)."""
    if not chunk or chunk >= T:
        return T
    return max(c for c in range(1, chunk + 1) if T % c == 0)


def cross_entropy_sum(
    params: gpn.Params, p_TxBxD: Array, targets_TxB: Array, chunk: int = 0
) -> Array:
    """Sum over positions of CE(decode(p_t), x_t), decoded `chunk` time steps at a time.

    Each chunk is rematerialised, so neither pass holds more than (chunk, B, V) logits.
    """
    c = chunk_size(p_TxBxD.shape[0], chunk)

    @jax.checkpoint
    def chunk_ce(p, x):
        logits = gpn.decode(params, p)
        return optax.softmax_cross_entropy_with_integer_labels(logits, x).sum()

    def body(total, px):
        return total + chunk_ce(*px), None

    total, _ = jax.lax.scan(
        body, jnp.zeros((), jnp.float32), (_chunks(p_TxBxD, c), _chunks(targets_TxB, c))
    )
    return total


def per_token_cross_entropy(params: gpn.Params, p_TxBxD: Array, targets_TxB: Array, chunk: int = 0):
    """CE of every position (T, B), decoded chunk by chunk (for evaluation)."""
    c = chunk_size(p_TxBxD.shape[0], chunk)

    def body(_, px):
        p, x = px
        return None, optax.softmax_cross_entropy_with_integer_labels(gpn.decode(params, p), x)

    _, ce = jax.lax.scan(body, None, (_chunks(p_TxBxD, c), _chunks(targets_TxB, c)))
    return ce.reshape(targets_TxB.shape)
