"""The memory kernels (`gpn_jax.native.memory`): the recomputation gives the memories XLA's scan
of writes gives, the backward's two passes compute their formulas, and the fused window's
gradients through them equal plain autodiff's, with document resets and the log-decay output's
cotangent. Used where the product kernel is and the memory is float32 (the passes: one predict
layer, no remat); XLA's operations otherwise."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpn_jax.core import fast_window
from gpn_jax.native import memory, small_matmul
from tests.core.test_fast_window import pair, random_carry, random_params, tokens
from tests.native.test_small_matmul import _fused_grad_hlo, needs_compiler
from tests.tolerance import assert_rel_close

STEP, STACK, REDUCE, UPDATE = memory.TARGETS


def _segment(S: int, B: int, h: int, k: int, u: int, seed: int = 0):
    """A segment's stored write inputs (Z0's key, write and layer-0 columns), starting memory."""
    dm = fast_window.Dims(d=8, f=3, h=h, k=k, u=u, n_layers=1, memory=True, segment=S, remat=False)
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    zk = jax.random.normal(keys[0], (S, B, dm.hk))
    Z0 = jax.random.normal(keys[1], (S, B, dm.write_cols + sum(dm.layer_cols())))
    res = fast_window.Res(None, zk, Z0, [], [], None, None, [], [])
    fw = {"a": jnp.exp(jax.random.normal(keys[2], (h,)))}
    M0 = jax.random.normal(keys[3], (B, h, k, u))
    return dm, fw, M0, res


def _keep(S: int, B: int):
    return jnp.ones((S, B)).at[S // 2, 0].set(0.0).at[S - 1, B - 1].set(0.0)


@needs_compiler
@pytest.mark.parametrize("S,B,h,k,u", [(9, 3, 3, 4, 5), (32, 2, 4, 64, 128), (1, 1, 1, 1, 1)])
def test_the_recomputed_memories_equal_the_scan_of_writes(S, B, h, k, u):
    """Every step's memory before its reset, with document starts (keep 0) on some rows and
    steps, and each step's Mi^T k and Mi^T q. Measured (2026-12-03, AVX2): memories at most
    1.2e-7 and 3.6e-7 from XLA's (entries up to 2.7 and 4.5), 0 for the 1 x 1 memory: float32
    rounding of the same operations; the bounds allow ~25x (a wrong step, row or reset errs by
    O(1))."""
    dm, fw, M0, res = _segment(S, B, h, k, u)
    keep = _keep(S, B)
    want = fast_window._recompute_memory(dm, fw, M0, res, keep)
    assert memory.available(jnp.float32)
    fast = dataclasses.replace(dm, native=True)
    Ms, kM, qM = jax.jit(lambda *a: fast_window._memory_stack(fast, fw, *a))(M0, res, keep)
    assert Ms.shape == (S, B, h, k, u) and Ms.dtype == jnp.float32
    scale = float(jnp.max(jnp.abs(want)))
    np.testing.assert_allclose(Ms, want, rtol=0, atol=2e-6 * scale)
    np.testing.assert_array_equal(Ms[0], M0)
    Mi = want * keep[:, :, None, None, None]
    zw = res.Z0[..., dm.hk : dm.write_cols]
    k_, *_ = fast_window._write_inputs(dm, res.zk, zw, fw["a"])
    zq = fast_window._split(res.Z0[..., dm.write_cols :], dm.layer_cols())[3]
    q_ = fast_window._query(dm, zq)
    for got, vec in ((kM, k_), (qM, q_)):
        np.testing.assert_allclose(got, jnp.einsum("sbhk,sbhku->sbhu", vec, Mi), atol=2e-6 * scale)


def _random(shapes, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), len(shapes))
    return [jax.random.normal(key, s) for key, s in zip(keys, shapes, strict=True)]


@needs_compiler
@pytest.mark.parametrize("S,B,H,K,U,t", [(4, 3, 2, 5, 13, 2), (2, 2, 4, 64, 128, 0)])
def test_the_backward_passes_compute_their_formulas(S, B, H, K, U, t):
    """`grad_reduce` and `grad_update` at step t of a stack, a reset row included, against the
    formulas (`fast_window._memory_bwd`) as einsums. Measured (2026-12-03, AVX2): at most 2.9e-6
    absolute (a sum of 65 products of unit normals); a wrong row, step or reset errs by O(1)."""
    Ms, dM, k, q, w, dkM, dqM, eg = _random(
        [(S, B, H, K, U), (B, H, K, U), *[(B, H, K)] * 2, *[(B, H, U)] * 3, (B, H)]
    )
    keep = jnp.ones((B,)).at[1].set(0.0)
    Mi = keep[:, None, None, None] * Ms[t]
    got = jax.jit(memory.grad_reduce)(Ms, t, keep, dM, k, w)
    want = (
        jnp.einsum("bhku,bhk->bhu", dM, k),
        jnp.einsum("bhku,bhu->bhk", dM, w),
        jnp.sum(dM * Mi, axis=(-2, -1)),
    )
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=3e-5)
    got = jax.jit(memory.grad_update)(Ms, t, keep, dM, k, q, dkM, dqM, eg)
    dMi = (
        eg[..., None, None] * dM
        + k[..., None] * dkM[..., None, :]
        + q[..., None] * dqM[..., None, :]
    )
    want = (
        keep[:, None, None, None] * dMi,
        jnp.einsum("bhku,bhu->bhk", Mi, dkM),
        jnp.einsum("bhku,bhu->bhk", Mi, dqM),
    )
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=3e-5)


@needs_compiler
def test_fused_window_gradients_through_the_memory_kernels_equal_autodiff(monkeypatch):
    """One predict layer, 4-step segments (4 of them), a random carry, document resets, and a
    term on the log decays (the window's other output): the loss, final carry and gradients
    against plain autodiff. Measured (2026-12-03, AVX2): loss bit-equal, carry 2.1e-7,
    gradients 5.8e-7 relative to each leaf's norm; the bounds are test_fast_window's (~50x)."""
    monkeypatch.setenv("GPN_JAX_NATIVE", "1")
    monkeypatch.setattr(fast_window, "MIN_SEGMENT", 4)
    ref, fused = pair(n_layers=1, n_heads=2, d_key=8, d_value=16)
    params, carry, x = random_params(ref), random_carry(ref), tokens(16)
    resets = jnp.zeros(x.shape, bool).at[0, 5].set(True).at[1, 8].set(True)

    def run(model):
        def f(p, c):
            loss, (c2, _) = model.loss(p, x, c, resets=resets)
            decay = model.predicted_states(p, x, c)[0].log_decay
            extra = sum(jnp.sum(jnp.sin(a)) for a in jax.tree.leaves(c2)) + jnp.sum(jnp.cos(decay))
            return loss + 0.1 * extra, (loss, c2)

        return jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(params, carry)

    hlo = _fused_grad_hlo(fused, params, x, carry)
    assert all(t in hlo for t in memory.TARGETS)
    (_, (loss_r, carry_r)), grads_r = run(ref)
    (_, (loss_f, carry_f)), grads_f = run(fused)
    assert_rel_close(loss_f, loss_r, 2e-6, "loss")
    assert_rel_close(carry_f, carry_r, 1e-5, "carry")
    assert_rel_close(grads_f, grads_r, 3e-5, "gradients")


@needs_compiler
@pytest.mark.parametrize(
    "kw,targets",
    [
        (dict(n_layers=1), {STEP, STACK, REDUCE, UPDATE}),
        (dict(n_layers=2), {STEP, STACK}),  # the passes take one layer's query
        (dict(n_layers=1, remat_segment=3), {STEP}),  # remat reruns the forward
        (dict(n_layers=1, memory_dtype="bfloat16"), set()),
    ],
)
def test_which_windows_use_the_memory_kernels(monkeypatch, kw, targets):
    """With the product kernel (GPN_JAX_NATIVE=1): which memory kernels the backward calls;
    GPN_JAX_NATIVE=0 calls none."""
    monkeypatch.setenv("GPN_JAX_NATIVE", "1")
    x = tokens(9)
    model = pair(**kw)[1]
    params = model.init(jax.random.PRNGKey(0))
    assert small_matmul.available()
    hlo = _fused_grad_hlo(model, params, x, random_carry(model))
    assert {t for t in memory.TARGETS if t in hlo} == targets
    monkeypatch.setenv("GPN_JAX_NATIVE", "0")
    assert not any(
        t in _fused_grad_hlo(model, params, x, random_carry(model)) for t in memory.TARGETS
    )
