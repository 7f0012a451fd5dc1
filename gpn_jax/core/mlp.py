"""The SwiGLU feed-forward block of every model family.

    ffn(x) = (silu(x W1) * (x W3)) W2        W1, W3: (D, F) gate and up;  W2: (F, D) down

Gate and up are separate matrices (not one (D, 2F) [gate | up] split after the product) so
that splitting d_ffn over the `tensor` mesh axis keeps each device's gate and up columns
together: W1 and W3 column-parallel, W2 row-parallel, and the block needs exactly one
reduction (of its W2 partial sums) with no resharding in between. With a fused (D, 2F)
matrix the split halves live on different devices and XLA moves them per call, which inside
the recurrent scan means per token.
"""

import jax

from gpn_jax.core.norms import mm

Array = jax.Array


def swiglu(lp: dict, x: Array) -> Array:
    """SwiGLU of an already-normalised `x` (..., D) with `lp`'s `w1`, `w3`, `w2`; float32 out."""
    return mm(jax.nn.silu(mm(x, lp["w1"])) * mm(x, lp["w3"]), lp["w2"])
