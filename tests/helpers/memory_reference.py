"""Plain-jnp references for the memory's four passes (`gpn_jax.kernels.cpu.memory`'s semantics), for
checking the kernels: the forward's write and read as `fast_window._write` / `_read_out` compute
them (float32 arithmetic, the new memory rounded to M's dtype, the read from the stored memory),
the recomputation as `fast_window._recompute_memory`'s scan, and the backward's passes as
`jax.vjp` of those formulas (autodiff, not the kernels' hand-derived products)."""

import jax
import jax.numpy as jnp

F32 = jnp.float32


def write(Mi_f32, k, v, beta, eg):
    """M' = eg Mi + k (beta (v - Mi^T k))^T per (b, h), float32."""
    kM = jnp.einsum("bhk,bhku->bhu", k, Mi_f32)
    w = beta[..., None] * (v - kM)
    return eg[..., None, None] * Mi_f32 + jnp.einsum("bhk,bhu->bhku", k, w)


def step(M, k, q, v, beta, eg):
    """(M' in M's dtype, o = M'^T q from the stored M')."""
    Mn = write(M.astype(F32), k, v, beta, eg).astype(M.dtype)
    return Mn, jnp.einsum("bhk,bhku->bhu", q, Mn.astype(F32))


def stack(M0, k, q, v, beta, eg, keep):
    """(Ms, kM, qM): a scan of the stored-dtype writes, Ms[t] before step t's reset."""

    def body(M, x):
        kt, qt, vt, bt, et, kp = x
        Mi = M.astype(F32) * kp[:, None, None, None]
        kM = jnp.einsum("bhk,bhku->bhu", kt, Mi)
        qM = jnp.einsum("bhk,bhku->bhu", qt, Mi)
        return write(Mi, kt, vt, bt, et).astype(M.dtype), (M, kM, qM)

    return jax.lax.scan(body, M0, (k, q, v, beta, eg, keep))[1]


def grad_reduce(Ms, t, keep_B, dM, k, w):
    """(dM^T k, dM w, <dM, Mi>) as the vjp of M' = eg Mi + k w^T (Mi = keep Ms[t]) with respect
    to w, k and eg, at cotangent dM."""
    Mi = Ms[t].astype(F32) * keep_B[:, None, None, None]
    eg = jnp.ones(w.shape[:2], F32)

    def f(k, w, eg):
        return eg[..., None, None] * Mi + jnp.einsum("bhk,bhu->bhku", k, w)

    dk, dw, deg = jax.vjp(f, k, w, eg)[1](dM)
    return dw, dk, deg


def grad_update(Ms, t, keep_B, dM, k, q, dkM, dqM, eg):
    """(dM_prev, Mi dkM, Mi dqM) as the vjp, with respect to the memory before its reset and to
    k and q, of (M' = eg Mi + ..., kM = Mi^T k, qM = Mi^T q) with Mi = keep Ms[t], at
    cotangents (dM, dkM, dqM); the k and q parts from kM and qM only."""
    keep = keep_B[:, None, None, None]

    def f(M, k, q):
        Mi = M * keep
        return (
            eg[..., None, None] * Mi,
            jnp.einsum("bhk,bhku->bhu", k, Mi),
            jnp.einsum("bhk,bhku->bhu", q, Mi),
        )

    dMprev, dk, dq = jax.vjp(f, Ms[t].astype(F32), k, q)[1]((dM, dkM, dqM))
    return dMprev, dk, dq
