"""Plain-jnp references for the memory's four passes (`gpn_jax.kernels.cpu.memory`'s semantics), for
checking the kernels: the forward's write and read as `fused_window._write` / `_read_out` compute
them (float32 arithmetic, the new memory rounded to M's dtype, the read from the stored memory),
the recomputation as `fused_window._recompute_memory`'s scan, and the backward's passes as
`jax.vjp` of those formulas (autodiff, not the kernels' hand-derived products)."""

import jax
import jax.numpy as jnp
import numpy as np

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


# ------------------------------------------------------------------ inputs and pass checks
# Shared by the Pallas kernels' tests of each variant (GPU grid, TPU); dims = (B, H, K, U, S).


def unit(x):
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def write_inputs(seed, dims, lead=()):
    """Write inputs in their real ranges: unit k, q; beta in (0.1, 0.9); eg in (0.5, 1)."""
    B, H, K, U, _ = dims
    ks = jax.random.split(jax.random.key(seed), 5)
    n = (*lead, B, H)
    k = unit(jax.random.normal(ks[0], (*n, K)))
    q = unit(jax.random.normal(ks[1], (*n, K)))
    v = jax.random.normal(ks[2], (*n, U))
    beta = jax.random.uniform(ks[3], n, minval=0.1, maxval=0.9)
    eg = jax.random.uniform(ks[4], n, minval=0.5, maxval=1.0)
    return k, q, v, beta, eg


def memory(seed, dtype, shape):
    return jax.random.normal(jax.random.key(seed), shape).astype(dtype)


def check_grad_reduce(kernels, dtype, dims, t, bound_per_term):
    """`kernels.grad_reduce` against `grad_reduce` (Ms read from storage by both: float32
    round-off only, `bound_per_term` per term of each output's reduction)."""
    from tests.tolerance import assert_rel_close

    B, H, K, U, S = dims
    Ms = memory(4, dtype, (S, B, H, K, U))
    dM = memory(5, F32, (B, H, K, U))
    k = write_inputs(6, dims)[0]
    w = jax.random.normal(jax.random.key(7), (B, H, U))
    keep_B = jnp.array([1.0, 0.0])  # row 1 starts a document at step t
    got = jax.jit(kernels.grad_reduce)(Ms, t, keep_B, dM, k, w)
    want = grad_reduce(Ms, t, keep_B, dM, k, w)
    for name, a, b, n in zip(("dM^T k", "dM w", "<dM, Mi>"), got, want, (K, U, K * U), strict=True):
        assert a.dtype == F32 and a.shape == b.shape, name
        assert_rel_close(a, b, bound_per_term * n, name)
    np.testing.assert_array_equal(got[2][1], 0.0)  # the reset row's memory is zero


def check_grad_update(kernels, dtype, dims, bound_per_term):
    """`kernels.grad_update` against `grad_update` at t = 2, row 0 reset there."""
    from tests.tolerance import assert_rel_close

    B, H, K, U, S = dims
    Ms = memory(8, dtype, (S, B, H, K, U))
    dM = memory(9, F32, (B, H, K, U))
    k, q, _, _, eg = write_inputs(10, dims)
    dkM, dqM = jax.random.normal(jax.random.key(11), (2, B, H, U))
    keep_B = jnp.array([0.0, 1.0])
    got = jax.jit(kernels.grad_update)(Ms, 2, keep_B, dM, k, q, dkM, dqM, eg)
    want = grad_update(Ms, 2, keep_B, dM, k, q, dkM, dqM, eg)
    for name, a, b, n in zip(("dM_prev", "Mi dkM", "Mi dqM"), got, want, (3, U, U), strict=True):
        assert a.dtype == F32 and a.shape == b.shape, name
        assert_rel_close(a, b, bound_per_term * n, name)
    np.testing.assert_array_equal(got[0][0], 0.0)  # reset row: no cotangent flows past it
