"""`gpn_jax.core.loss`: the one chunked cross-entropy every family decodes with."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gpn_jax.core import loss

T, B, D, V = 12, 3, 8, 50


def test_chunk_size_is_the_largest_divisor_not_above_chunk():
    assert [loss.chunk_size(12, c) for c in (0, 1, 4, 5, 7, 12, 99)] == [12, 1, 4, 4, 6, 12, 12]


def _problem():
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    h = jax.random.normal(k1, (T, B, D))
    w = jax.random.normal(k2, (D, V))
    x = jax.random.randint(k3, (T, B), 0, V)
    return h, w, x


@pytest.mark.parametrize("chunk", [0, 4, 5])
def test_chunked_equals_full_logits_value_and_gradient(chunk):
    h, w, x = _problem()
    full = lambda h, w: optax.softmax_cross_entropy_with_integer_labels(h @ w, x)
    per_token = loss.per_token_cross_entropy(lambda hc: hc @ w, h, x, chunk)
    assert per_token.shape == (T, B)
    # measured on AVX2: per-token values equal exactly (|CE| up to 19); the sum and the
    # gradients differ by float32 summation order, relative 1.1e-7 and 1.2e-7. Tolerances
    # leave ~40x for other CPUs' matmul tiling.
    np.testing.assert_allclose(per_token, full(h, w), rtol=0, atol=1e-5)
    summed = lambda h, w: loss.cross_entropy_sum(lambda hc: hc @ w, h, x, chunk)
    np.testing.assert_allclose(summed(h, w), full(h, w).sum(), rtol=5e-6)
    g = jax.grad(summed, argnums=(0, 1))(h, w)
    g_ref = jax.grad(lambda h, w: full(h, w).sum(), argnums=(0, 1))(h, w)
    for a, b in zip(g, g_ref, strict=True):
        assert float(jnp.linalg.norm(a - b)) <= 5e-6 * float(jnp.linalg.norm(b))
