"""`gpn_jax.core.loss`: the one chunked cross-entropy every family decodes with."""

import jax
import optax
import pytest

from gpn_jax.core import loss
from tests.helpers.window import f32_bound
from tests.tolerance import assert_rel_close

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
    summed = lambda h, w: loss.cross_entropy_sum(lambda hc: hc @ w, h, x, chunk)

    @jax.jit  # one program (eager dispatch compiles one per op)
    def both(h, w):
        per_token = loss.per_token_cross_entropy(lambda hc: hc @ w, h, x, chunk)
        g = jax.grad(summed, argnums=(0, 1))(h, w)
        g_ref = jax.grad(lambda h, w: full(h, w).sum(), argnums=(0, 1))(h, w)
        return per_token, full(h, w), summed(h, w), g, g_ref

    per_token, full_ce, sum_ce, g, g_ref = both(h, w)
    assert per_token.shape == (T, B)
    # each CE: a logsumexp over V logits, each a D-long contraction, in another tiling; the
    # sum and the gradients add the chunked sum over T * B positions
    per_token_bound, sum_bound = f32_bound(D + V), f32_bound(D + V + T * B)
    assert_rel_close(per_token, full_ce, per_token_bound, "per-token CE")
    assert_rel_close(sum_ce, full_ce.sum(), sum_bound, "CE sum")
    assert_rel_close(g, g_ref, sum_bound, "gradients")
