"""Drives the GPN step over a window with `lax.scan`.

Everything that does not depend on the recurrence stays out of the loop: the token-side
grounding projection is computed for all positions before the scan, and decode +
cross-entropy run after it on the stacked predicted states (`gpn_jax.core.loss`, chunked
over time so the (B, T, V) logits never exist at once, forward or backward).
"""

import jax

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
    keep_TxB: Array | None = None,
) -> tuple[GPNCarry, StepOutput]:
    """Runs `gpn.step` over T positions. Returns (final carry, StepOutput stacked to (T, B, ...)).

    With `remat_segment` = S > 0 the window is cut into T/S segments; each segment's
    activations are recomputed in the backward pass, so only segment-boundary carries are kept.
    `keep_TxB` (float, 0 at a document start) resets the incoming carry of those steps to the
    initial state (`gpn.reset_carry`); None: no resets.
    """
    if keep_TxB is None:
        body = lambda c, xg: gpn.step(params, c, xg, iv)
        xs = xg_TxBxD
    else:
        body = lambda c, x: gpn.step(params, gpn.reset_carry(c, x[1]), x[0], iv)
        xs = (xg_TxBxD, keep_TxB)
    T = xg_TxBxD.shape[0]
    if not remat_segment or remat_segment >= T:
        return jax.lax.scan(body, carry, xs)
    check_remat_segment(T, remat_segment)
    segments = jax.tree.map(
        lambda x: x.reshape(T // remat_segment, remat_segment, *x.shape[1:]), xs
    )

    @jax.checkpoint
    def segment(c, xg_seg):
        return jax.lax.scan(body, c, xg_seg)

    carry, out = jax.lax.scan(segment, carry, segments)
    return carry, jax.tree.map(lambda x: x.reshape(T, *x.shape[2:]), out)
