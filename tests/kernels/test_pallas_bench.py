"""The microbenchmark's XLA formulas equal the reference passes, and `time_passes` reports every
field it promises (its timings are not asserted)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpn_jax.kernels.pallas import bench
from tests.helpers import memory_reference as ref
from tests.tolerance import assert_rel_close

EPS32 = 1.19e-7
MARGIN = 4
B, H, K, U, S = 2, 3, 8, 16, 4


@pytest.fixture(scope="module")
def x():
    return bench._inputs(B, H, K, U, S, jnp.float32, jax.random.key(1))


def test_xla_formulas_match_reference(x):
    one = [x[n][0] for n in ("k", "q", "v", "beta", "eg")]
    keep = x["keep"].at[1, 0].set(0.0)
    dM, keep_B = x["dM"], keep[1]
    # float32 sums over at most K U terms in another order: eps32 x K U x MARGIN
    bound = EPS32 * K * U * MARGIN
    assert_rel_close(bench.xla_step(x["M"], *one), ref.step(x["M"], *one), bound, "step")
    seq = [x[n] for n in ("k", "q", "v", "beta", "eg")]
    assert_rel_close(
        bench.xla_stack(x["M"], *seq, keep), ref.stack(x["M"], *seq, keep), bound, "stack"
    )
    k, q, v, _, eg = one
    got = bench.xla_grad_reduce(x["Ms"], 1, keep_B, dM, k, v)
    assert_rel_close(got, ref.grad_reduce(x["Ms"], 1, keep_B, dM, k, v), bound, "reduce")
    got = bench.xla_grad_update(x["Ms"], 1, keep_B, dM, k, q, v, v, eg)
    want = ref.grad_update(x["Ms"], 1, keep_B, dM, k, q, v, v, eg)
    assert_rel_close(got, want, bound, "update")


def test_time_passes_reports_each_field():
    out = bench.time_passes(B, H, K, U, "bfloat16", "cpu", S=S, reps=2, passes=("grad_update",))
    assert set(out) == {"grad_update"}
    row = out["grad_update"]
    assert row["min_bytes_per_token"] == H * K * U * (2 + 2 * 4)  # Ms[t] bf16, dM read + write
    for key in ("xla_us_per_token", "pallas_us_per_token"):
        assert np.isfinite(row[key]) and row[key] > 0, key
