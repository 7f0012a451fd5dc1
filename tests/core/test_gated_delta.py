"""Gated delta rule: chunked (UT transform) vs the float32 recurrent oracle, values and gradients."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpn_jax.core import gated_delta as gd
from gpn_jax.core.norms import l2n
from tests.helpers.window import f32_bound
from tests.tolerance import rel_err

B, H = 1, 2
# Relative RMSE of the chunked form against the recurrent oracle, outputs and every gradient:
# the chunked form sums a chunk's (up to 64) positions in another order than the recurrence,
# eps x 64.
TOL = f32_bound(64, margin=1.0)
NAMES = ("q", "k", "v", "beta", "g", "S0")


def inputs(T, K, c, seed=0):
    """q, k (L2-normalised, as in the model), v, beta, g = logsigmoid(x)/c (c=None: g=0), S0."""
    ks = jax.random.split(jax.random.PRNGKey(seed), 6)
    q = jax.random.normal(ks[0], (B, T, H, K))
    k = l2n(jax.random.normal(ks[1], (B, T, H, K)))
    v = jax.random.normal(ks[2], (B, T, H, K))
    beta = jax.nn.sigmoid(jax.random.normal(ks[3], (B, T, H)))
    x = jax.random.normal(ks[4], (B, T, H))
    g = jnp.zeros_like(x) if c is None else jax.nn.log_sigmoid(x) / c
    S0 = 0.5 * jax.random.normal(ks[5], (B, H, K, K))
    return q, k, v, beta, g, S0


def rel(a, b):
    """RMSE(a - b) / RMSE(b), in float64 NumPy (eager JAX ops compile a program per shape)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean(np.square(a - b))) / (np.sqrt(np.mean(np.square(b))) + 1e-30))


@functools.partial(jax.jit, static_argnames="chunk_size")
def both(q, k, v, beta, g, S0, chunk_size=64):
    """(o, S, grads) of each form; the cotangent is a fixed random projection of o and S."""
    ko, ks = jax.random.split(jax.random.PRNGKey(42))
    Po = jax.random.normal(ko, (B, q.shape[1], H, v.shape[-1]))
    Ps = jax.random.normal(ks, S0.shape)

    def run(fn):
        def objective(*a):
            o, S = fn(*a)
            return jnp.sum(o * Po) + jnp.sum(S * Ps), (o, S)

        grads, (o, S) = jax.grad(objective, argnums=range(6), has_aux=True)(q, k, v, beta, g, S0)
        return o, S, grads

    rec = run(lambda q, k, v, b, g, s: gd.recurrent(q, k, v, b, g, initial_state=s))
    chk = run(
        lambda q, k, v, b, g, s: gd.chunked(q, k, v, b, g, initial_state=s, chunk_size=chunk_size)
    )
    return rec, chk


def check(T, K, c, chunk_size=64):
    (o_r, S_r, g_r), (o_c, S_c, g_c) = both(*inputs(T, K, c), chunk_size=chunk_size)
    for grad in g_c:
        assert np.isfinite(np.asarray(grad)).all()
    errs = {"o": rel(o_c, o_r), "S": rel(S_c, S_r)}
    errs |= {f"d{n}": rel(a, b) for n, a, b in zip(NAMES, g_c, g_r, strict=True)}
    bad = {n: e for n, e in errs.items() if not e < TOL}
    assert not bad, f"T={T} K={K} c={c}: {bad} (all: {errs})"
    return errs


DECAYS = [0.01, 0.1, 1.0, 10.0, None]  # g = logsigmoid(x)/c; None: g = 0 exactly


@pytest.mark.parametrize("c", DECAYS)
def test_chunked_matches_recurrent_all_decays(c):
    check(75, 60, c)  # 64 + a padded partial chunk of 11


# Same-shape cases share one compile; T=500 spans 8 chunks (last one padded by 12).
# Each new shape costs a compile of both forms and their gradients (~5 s on 2 cores), so
# the two remaining corners of T x K run only with the slow tests.
slow = pytest.mark.slow
SIZES = [(63, 100, 1.0), (63, 100, None), (500, 128, 0.1), (500, 128, None)]
SIZES += [pytest.param(63, 128, 0.01, marks=slow), pytest.param(500, 100, 10.0, marks=slow)]


@pytest.mark.parametrize("T,K,c", SIZES)
def test_chunked_matches_recurrent_sizes(T, K, c):
    check(T, K, c)


@slow
def test_small_chunks_and_strong_decay_have_finite_grads():
    check(75, 60, 0.01, chunk_size=16)  # 5 chunks, last one padded


def test_step_and_default_state():
    q, k, v, beta, g, _ = inputs(5, 8, 1.0)
    o, S = jax.jit(gd.recurrent)(q, k, v, beta, g)
    S_t, step = jnp.zeros((B, H, 8, 8)), jax.jit(gd.step)
    for t in range(5):
        o_t, S_t = step(S_t, q[:, t], k[:, t], v[:, t], beta[:, t], g[:, t])
        # the same operations; a compilation may reorder one contraction over K = 8
        assert rel_err(o_t, o[:, t]) <= f32_bound(8, margin=1.0)
    assert rel_err(S_t, S) <= f32_bound(8, margin=1.0)
    # The rule by hand for one head and one step from a zero state: S = beta k v^T.
    # a few roundings per entry (decay, beta, the outer product)
    by_hand = step(jnp.zeros((8, 8)), q[0, 0, 0], k[0, 0, 0], v[0, 0, 0], beta[0, 0, 0], g[0, 0, 0])
    want = beta[0, 0, 0] * jnp.outer(k[0, 0, 0], v[0, 0, 0])
    assert rel_err(by_hand[1], want) <= f32_bound(2)


def test_flops_counts_positive_and_grow_with_chunk():
    assert gd.flops_per_token(2, 64, 64, 64) > gd.flops_per_token(2, 64, 64, 16) > 0


def test_chunked_matches_recurrent_with_beta_up_to_two():
    """Negative eigenvalues (Grazzi et al. 2024): beta = 2 sigmoid(x) in [0, 2], with some
    positions at exactly 2 (a Householder reflection when g = 0), chunked == recurrent."""
    q, k, v, beta, g, S0 = inputs(75, 60, 1.0, seed=3)
    beta = (2.0 * beta).at[:, ::7].set(2.0)
    assert float(beta.max()) == 2.0 and float(beta.min()) < 1.0
    (o_r, S_r, g_r), (o_c, S_c, g_c) = both(q, k, v, beta, g, S0)
    errs = {"o": rel(o_c, o_r), "S": rel(S_c, S_r)}
    errs |= {f"d{n}": rel(a, b) for n, a, b in zip(NAMES, g_c, g_r, strict=True)}
    assert all(e < TOL for e in errs.values()), errs


@pytest.mark.parametrize("form", ["recurrent", "chunked"])
def test_beta_two_reflects_the_state(form):
    """beta = 2, g = 0, v = 0 and a unit key k: S' = (I - 2 k k^T) S, so a state k u^T flips
    sign (eigenvalue -1) and two steps restore it: the sign flip parity needs."""
    K = U = 4
    k = jnp.asarray([0.6, 0.8, 0.0, 0.0])
    u = jnp.asarray([1.0, -2.0, 0.5, 3.0])
    S0 = jnp.outer(k, u)[None, None]  # (B=1, H=1, K, U)
    ks = jnp.broadcast_to(k, (1, 2, 1, K))
    zeros_v = jnp.zeros((1, 2, 1, U))
    ones = jnp.ones((1, 2, 1))
    fn = gd.recurrent if form == "recurrent" else functools.partial(gd.chunked, chunk_size=2)
    o, S = jax.jit(fn)(ks, ks, zeros_v, 2.0 * ones, 0.0 * ones, initial_state=S0)
    # after step 1 the read is (-k u^T)^T k / sqrt(K) = -u / 2; after step 2 it is +u / 2
    bound = f32_bound(2 * K, margin=4.0)
    assert rel_err(o[0, 0, 0], -u / 2) <= bound
    assert rel_err(o[0, 1, 0], u / 2) <= bound
    assert rel_err(S[0, 0], S0[0, 0]) <= bound
