"""The reference backend `gpn_jax.kernels.xla`, against which every other backend is tested:
its write is the model's (`core.gpn.memory_write` through `delta_write`), its stack is the scan
of its steps, its hand-derived backward pass equals autodiff of the write and the read, and
`resolve` hands it to the fused window for `model.kernels=xla`.

Tolerances are norm-relative, float32 round-off eps32 x n x 4 with n the longest reduction
(`tests/tolerance.py`); the backward's pass and autodiff compute the same float32 products in
another grouping."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpn_jax import kernels
from gpn_jax.kernels import xla
from tests.helpers import memory_reference as ref
from tests.tolerance import assert_rel_close, f32_bound

B, H, K, U, S = 2, 3, 8, 16, 4
DIMS = (B, H, K, U, S)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("t", [0, 2])
def test_grad_equals_autodiff_of_the_write_and_read(dtype, t):
    ref.check_grad(xla.memory_kernels(), dtype, DIMS, t, f32_bound(1, 4), ref.grad_by_autodiff)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_stack_is_the_scan_of_steps_with_resets(dtype):
    M0 = ref.memory(0, dtype, (B, H, K, U))
    k, q, v, beta, eg = ref.write_inputs(1, DIMS, lead=(S,))
    keep = jnp.ones((S, B)).at[2, 0].set(0.0)
    Ms, kM, qM = jax.jit(xla.stack)(M0, k, q, v, beta, eg, keep)
    M = M0
    for t in range(S):
        np.testing.assert_array_equal(Ms[t], M)  # the same float32 formulas, step by step
        Mi = M * keep[t][:, None, None, None].astype(M.dtype)
        assert_rel_close(kM[t], xla.col_sum(k[t], Mi.astype(jnp.float32)), f32_bound(K, 4))
        assert_rel_close(qM[t], xla.col_sum(q[t], Mi.astype(jnp.float32)), f32_bound(K, 4))
        M = xla.step(Mi, k[t], q[t], v[t], beta[t], eg[t])[0]
    assert Ms.dtype == jnp.dtype(dtype)


def test_step_writes_the_models_rule_and_reads_the_stored_memory():
    M = ref.memory(2, "bfloat16", (B, H, K, U))
    k, q, v, beta, eg = ref.write_inputs(3, DIMS)
    Mn, o = xla.step(M, k, q, v, beta, eg)
    Mf = M.astype(jnp.float32)
    want = (
        eg[..., None, None] * Mf
        + k[..., None] * (beta[..., None] * (v - xla.col_sum(k, Mf)))[..., None, :]
    )
    assert Mn.dtype == jnp.bfloat16
    assert_rel_close(Mn.astype(jnp.float32), want.astype(jnp.bfloat16).astype(jnp.float32), 2.0**-8)
    np.testing.assert_array_equal(o, xla.col_sum(q, Mn.astype(jnp.float32)))


@pytest.mark.parametrize("platform", ["cpu", "gpu", "tpu"])
def test_resolve_hands_the_reference_for_xla(platform):
    got = kernels.resolve("xla", platform)
    assert got.name == "xla" and got.grad is xla.grad and kernels.name(got) == "xla"
