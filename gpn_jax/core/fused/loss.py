"""The fused cross-entropy: `loss.cross_entropy_sum` over `gpn.decode` with its gradients
computed in the forward pass.

The loss is a sum of per-position CEs whose gradient (softmax - onehot) is known in the forward
pass: computing it there, chunk by chunk, costs 3 decode-sized matmuls per chunk instead of the
4 of a rematerialised chunk (forward, recompute, two backward), and the (chunk, B, V) logits
still never exist twice. The backward only scales the saved gradients.
"""

import jax
import jax.numpy as jnp
import numpy as np

from gpn_jax.core import gpn, loss
from gpn_jax.core.fused.products import bias_grad, mm_t, segments, unsegment, wgrad
from gpn_jax.core.norms import mm, rms

Array = jax.Array


# The loss is a sum of per-position CEs whose gradient (softmax - onehot) is known in the forward
# pass: computing it there, chunk by chunk, costs 3 decode-sized matmuls per chunk instead of
# the 4 of a rematerialised chunk (forward, recompute, two backward), and the (chunk, B, V)
# logits still never exist twice. The backward only scales the saved gradients.
def _ce_chunk_grads(x, W, bias, E, tgt):
    """CE sum of a chunk and the gradients of that sum w.r.t. (x, W, bias, E)."""
    z = mm(x, W) + bias  # (C, B, Ee)
    logits = mm(z, E.T)  # (C, B, V)
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, tgt[..., None], axis=-1)[..., 0]
    dlog = jnp.exp(logits - lse[..., None]) - jax.nn.one_hot(
        tgt, logits.shape[-1], dtype=logits.dtype
    )
    dz = mm(dlog, E)
    # float32: dE's transpose (Ee, V), with the (C, B, V) cotangent as the right operand, which
    # XLA:CPU then does not copy transposed, accumulated as such over the chunks (`_ce_fwd`;
    # transposing each chunk's, XLA folds the transpose back into a slower product); a 16-bit dot
    # with a transposed output is not supported there, hence the plain form for other dtypes
    dE = wgrad(z, dlog, E.T) if _dE_transposed(E) else wgrad(dlog, z, E)
    dW = wgrad(x, dz, W)
    return jnp.sum(lse - picked), (mm_t(dz, W), dW, bias_grad(dz), dE)


def _dE_transposed(E: Array) -> bool:
    """Whether `_ce_chunk_grads` gives the embedding's gradient as its transpose (Ee, V)."""
    return E.dtype == jnp.float32


def _ce_primal(c, W, bias, E, P, tgt):
    def body(total, pt):
        p, t = pt
        logits = mm(mm(rms(p), W) + bias, E.T)
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, t[..., None], axis=-1)[..., 0]
        return total + jnp.sum(lse - picked), None

    return jax.lax.scan(body, jnp.zeros((), jnp.float32), (segments(P, c), segments(tgt, c)))[0]


def _ce_fwd(c, W, bias, E, P, tgt):
    def body(acc, pt):
        total, dW, db, dE = acc
        p, t = pt
        x, rms_p = jax.vjp(rms, p)
        ce, (dx, dW_c, db_c, dE_c) = _ce_chunk_grads(x, W, bias, E, t)
        return (total + ce, dW + dW_c, db + db_c, dE + dE_c), rms_p(dx)[0]

    f32 = lambda a: jnp.zeros(a.shape, jnp.float32)
    (total, dW, db, dE), dP = jax.lax.scan(
        body,
        (jnp.zeros((), jnp.float32), f32(W), f32(bias), f32(E.T if _dE_transposed(E) else E)),
        (segments(P, c), segments(tgt, c)),
    )
    dE = dE.T if _dE_transposed(E) else dE
    return total, (dW, db, dE, unsegment(dP), W, bias, E, tgt)


def _ce_bwd(c, saved, g):
    dW, db, dE, dP, W, bias, E, tgt = saved
    zero_tgt = np.zeros(tgt.shape, dtype=jax.dtypes.float0)
    return (
        (g * dW).astype(W.dtype),
        (g * db).astype(bias.dtype),
        (g * dE).astype(E.dtype),
        g * dP,
        zero_tgt,
    )


_ce_sum = jax.custom_vjp(_ce_primal, nondiff_argnums=(0,))


_ce_sum.defvjp(_ce_fwd, _ce_bwd)


def cross_entropy_sum_fused(cp: gpn.Params, p_TxBxD: Array, targets_TxB: Array, chunk: int = 0):
    """Same value as `loss.cross_entropy_sum` over `gpn.decode`; gradients computed in the
    forward pass."""
    dp = cp["decode"]
    W = (dp["norm"][:, None] * dp["proj"].astype(jnp.float32)).astype(dp["proj"].dtype)
    bias = dp["bias"].astype(jnp.float32) if "bias" in dp else jnp.zeros((W.shape[1],), jnp.float32)
    c = loss.chunk_size(p_TxBxD.shape[0], chunk)
    return _ce_sum(c, W, bias, cp["embed"], p_TxBxD, targets_TxB)
