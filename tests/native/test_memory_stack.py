"""The memory recomputation kernel (`gpn_jax.native.memory_stack`): the fused window's backward
gets the same memories from it as from XLA's scan of writes, where the product kernel is used and
the memory is float32, and XLA's scan otherwise."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpn_jax.core import fast_window
from gpn_jax.native import memory_stack, small_matmul
from tests.core.test_fast_window import random_carry, tokens
from tests.native.test_small_matmul import _fused_grad_hlo, _model, needs_compiler


def _segment(S: int, B: int, h: int, k: int, u: int, seed: int = 0):
    """A segment's stored write inputs (Z0's key and write columns) and starting memory."""
    dm = fast_window.Dims(d=8, f=8, h=h, k=k, u=u, n_layers=1, memory=True, segment=S, remat=False)
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    zk = jax.random.normal(keys[0], (S, B, dm.hk))
    Z0 = jax.random.normal(keys[1], (S, B, dm.write_cols + 8))
    res = fast_window.Res(None, zk, Z0, [], [], None, None, [], [])
    fw = {"a": jnp.exp(jax.random.normal(keys[2], (h,)))}
    M0 = jax.random.normal(keys[3], (B, h, k, u))
    return dm, fw, M0, res


@needs_compiler
@pytest.mark.parametrize("S,B,h,k,u", [(9, 3, 3, 4, 5), (32, 2, 4, 64, 128), (1, 1, 1, 1, 1)])
def test_the_kernels_memories_equal_the_scan_of_writes(S, B, h, k, u):
    """Every step's memory before its reset, with document starts (keep 0) on some rows and
    steps. Measured (2026-12-03, AVX2): at most 1.2e-7 and 3.6e-7 from XLA's (entries up to
    2.7 and 4.5), 0 for the 1 x 1 memory: float32 rounding of the same operations; the bound
    allows ~25x (a wrong step, row or reset errs by O(1))."""
    dm, fw, M0, res = _segment(S, B, h, k, u)
    keep = jnp.ones((S, B)).at[S // 2, 0].set(0.0).at[S - 1, B - 1].set(0.0)
    want = fast_window._recompute_memory(dm, fw, M0, res, keep)
    assert memory_stack.available(jnp.float32)
    fast = dataclasses.replace(dm, native=True)
    got = jax.jit(lambda M0, res, keep: fast_window._recompute_memory(fast, fw, M0, res, keep))(
        M0, res, keep
    )
    assert got.shape == (S, B, h, k, u) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * float(jnp.max(jnp.abs(want))))
    np.testing.assert_array_equal(got[0], M0)


@needs_compiler
def test_the_fused_window_recomputes_through_it_only_for_a_float32_memory(monkeypatch):
    """With the product kernel (GPN_JAX_NATIVE=1): the backward calls the memory kernel for a
    float32 memory; a bfloat16 memory (`memory_dtype`) keeps XLA's scan, and so does
    GPN_JAX_NATIVE=0. (Its gradients against XLA's: `test_fused_window_multiplies_through_the_kernel`.)"""
    monkeypatch.setenv("GPN_JAX_NATIVE", "1")
    x = tokens(9)
    for memory_dtype, used in (("float32", True), ("bfloat16", False)):
        model = _model(memory_dtype=memory_dtype)
        params = model.init(jax.random.PRNGKey(0))
        assert small_matmul.available()
        hlo = _fused_grad_hlo(model, params, x, random_carry(model))
        assert (memory_stack.TARGET in hlo) is used, memory_dtype
    monkeypatch.setenv("GPN_JAX_NATIVE", "0")
    model = _model()
    params = model.init(jax.random.PRNGKey(0))
    assert memory_stack.TARGET not in _fused_grad_hlo(model, params, x, random_carry(model))
