"""The memory's passes for checking the kernels: the reference backend `gpn_jax.kernels.xla` (the
one place their XLA formulas live), the autodiff form of its backward pass (`grad_by_autodiff`,
`jax.vjp` of the write and the read, which checks the reference's hand-derived products), the
pass inputs in their real ranges and one check of a backend's `grad` against the reference."""

import jax
import jax.numpy as jnp
import numpy as np

from gpn_jax.kernels import xla

F32 = jnp.float32
step, stack, grad = xla.step, xla.stack, xla.grad


def grad_by_autodiff(Ms, t, keep_B, dM, k, q, w, beta, eg, dkM_read, dqM):
    """`xla.grad` by autodiff: the vjp of (M' = eg Mi + k w^T, kM = Mi^T k, qM = Mi^T q) with
    Mi = keep Ms[t], at cotangents dM (of M'), dkM = dkM_read - beta dM^T k (w = beta (v - kM))
    and dqM, with respect to the memory before its reset, k (through M' and kM), q, w and eg."""
    keep = keep_B[:, None, None, None]

    def write(k, w, eg):
        return eg[..., None, None] * Mi + jnp.einsum("bhk,bhu->bhku", k, w)

    Mi = Ms[t].astype(F32) * keep
    dk_w, dMk, inner = jax.vjp(write, k, w, eg)[1](dM)
    dkM = dkM_read - beta[..., None] * dMk

    def reads(M, k, q):
        Mi = M * keep
        return (
            eg[..., None, None] * Mi,
            jnp.einsum("bhk,bhku->bhu", k, Mi),
            jnp.einsum("bhk,bhku->bhu", q, Mi),
        )

    dM_prev, Mi_dkM, Mi_dqM = jax.vjp(reads, Ms[t].astype(F32), k, q)[1]((dM, dkM, dqM))
    return dM_prev, dMk, dk_w, inner, Mi_dkM, Mi_dqM


# ------------------------------------------------------------------ inputs and pass checks
# Shared by the kernels' tests of each backend; dims = (B, H, K, U, S).


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


GRAD_OUTPUTS = ("dM_prev", "dM^T k", "dM w", "<dM, Mi>", "Mi dkM", "Mi dqM")


def grad_args(dtype, dims, t, keep_B):
    """The fused pass's arguments at step t: (Ms, t, keep_B, dM, k, q, w, beta, eg, dkM_read,
    dqM)."""
    B, H, K, U, S = dims
    Ms = memory(4, dtype, (S, B, H, K, U))
    dM = memory(5, F32, (B, H, K, U))
    k, q, _, beta, eg = write_inputs(6, dims)
    w, dkM_read, dqM = jax.random.normal(jax.random.key(7), (3, B, H, U))
    return Ms, t, keep_B, dM, k, q, w, beta, eg, dkM_read, dqM


def check_grad(kernels, dtype, dims, t, bound_per_term, want_fn=None):
    """`kernels.grad` against the reference (`want_fn`, default `xla.grad`; Ms read from
    storage by both: float32 round-off only) at step t, row 1 reset there."""
    from tests.tolerance import assert_rel_close

    keep_B = jnp.array([1.0, 0.0])
    args = grad_args(dtype, dims, t, keep_B)
    got = jax.jit(kernels.grad)(*args)
    want = (want_fn or grad)(*args)
    _, _, K, U, _ = dims
    n = {"dM_prev": K, "dM^T k": K, "dM w": U, "<dM, Mi>": K * U, "Mi dkM": K + U, "Mi dqM": U}
    for name, a, b in zip(GRAD_OUTPUTS, got, want, strict=True):
        assert a.dtype == F32 and a.shape == b.shape, name
        assert_rel_close(a, b, bound_per_term * n[name], name)
    # the reset row: no cotangent flows past it and its memory reads zero
    for name, a in zip(GRAD_OUTPUTS, got, strict=True):
        if name in ("dM_prev", "<dM, Mi>", "Mi dkM", "Mi dqM"):
            np.testing.assert_array_equal(a[1], 0.0, err_msg=name)


def shapes_130m(dtype, b):
    """The passes' arguments at 130M with b batch rows per device: H = 15, K = 128, U = 256,
    segment S = 64."""
    h, k, u, s = 15, 128, 256, 64
    f, sd = jnp.float32, jax.ShapeDtypeStruct
    i32 = sd((), jnp.int32)
    return {
        "step": (sd((b, h, k, u), dtype), sd((b, h, k), f), sd((b, h, k), f), sd((b, h, u), f))
        + (sd((b, h), f),) * 2,
        "stack": (sd((b, h, k, u), dtype), sd((s, b, h, k), f), sd((s, b, h, k), f))
        + (sd((s, b, h, u), f), sd((s, b, h), f), sd((s, b, h), f), sd((s, b), f)),
        "grad": (sd((s, b, h, k, u), dtype), i32, sd((b,), f), sd((b, h, k, u), f))
        + (sd((b, h, k), f),) * 2
        + (sd((b, h, u), f), sd((b, h), f), sd((b, h), f), sd((b, h, u), f), sd((b, h, u), f)),
    }
