"""The C++ memory kernels (`gpn_jax.kernels.cpu.memory`, `model.kernels=native`): the
recomputation gives the memories XLA's scan of writes gives, the backward's pass (the two C++
passes composed) matches the reference backend, and the fused window's gradients through them equal plain autodiff's, with
document resets and the log-decay output's cotangent. The window uses them for a float32 memory
(the backward's passes: one predict layer, with or without remat); the XLA formulas otherwise."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from gpn_jax import kernels
from gpn_jax.core.fused import backward as fused_backward
from gpn_jax.core.fused import forward as fused_forward
from gpn_jax.core.fused import layout as fused_layout
from gpn_jax.core.fused import stages as fused_stages
from gpn_jax.core.fused import window as fused_window
from gpn_jax.kernels.cpu import memory
from tests.helpers import memory_reference
from tests.helpers.window import (
    f32_bound,
    fused_grad_hlo,
    pair,
    random_carry,
    random_params,
    require_kernels,
    tokens,
    window_bound,
)
from tests.tolerance import assert_rel_close

STEP, STACK, REDUCE, UPDATE = memory.TARGETS


@pytest.fixture
def native():
    require_kernels("native")
    return kernels.resolve("native", "cpu")


def _segment(S: int, B: int, h: int, k: int, u: int, seed: int = 0):
    """A segment's stored write inputs (Z0's key, write and layer-0 columns), starting memory."""
    dm = fused_layout.Dims(d=8, f=3, h=h, k=k, u=u, n_layers=1, memory=True, segment=S, remat=False)
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    zk = jax.random.normal(keys[0], (S, B, dm.hk))
    Z0 = jax.random.normal(keys[1], (S, B, dm.write_cols + sum(dm.layer_cols())))
    res = fused_forward.Res(None, zk, Z0, [], [], None, None, [], [])
    fw = {"a": jnp.exp(jax.random.normal(keys[2], (h,)))}
    M0 = jax.random.normal(keys[3], (B, h, k, u))
    return dm, fw, M0, res


def _keep(S: int, B: int):
    return jnp.ones((S, B)).at[S // 2, 0].set(0.0).at[S - 1, B - 1].set(0.0)


@pytest.mark.parametrize("S,B,h,k,u", [(9, 3, 3, 4, 5), (32, 2, 4, 64, 128), (1, 1, 1, 1, 1)])
def test_the_recomputed_memories_equal_the_scan_of_writes(native, S, B, h, k, u):
    """Every step's memory before its reset, with document starts (keep 0) on some rows and
    steps, and each step's Mi^T k and Mi^T q."""
    dm, fw, M0, res = _segment(S, B, h, k, u)
    keep = _keep(S, B)
    want = fused_backward.recompute_memory(dm, fw, M0, res, keep)
    fast = dataclasses.replace(dm, kernels=native)
    stack = jax.jit(lambda *a: fused_backward.memory_stack(fast, fw, *a))
    Ms, kM, qM = stack(M0, res, keep)
    assert Ms.shape == (S, B, h, k, u) and Ms.dtype == jnp.float32
    # each memory: S writes, each with contractions over k and u, rounded in another order
    assert_rel_close(Ms, want, f32_bound(S * (k + u)), "memories")
    assert bool(jnp.all(Ms[0] == M0))
    Mi = want * keep[:, :, None, None, None]
    zw = res.Z0[..., dm.hk : dm.write_cols]
    k_, *_ = fused_stages.write_inputs(dm, res.zk, zw, fw["a"])
    zq = fused_stages.split_cols(res.Z0[..., dm.write_cols :], dm.layer_cols())[3]
    q_ = fused_stages.read_query(dm, zq)
    for got, vec in ((kM, k_), (qM, q_)):
        want_v = jnp.einsum("sbhk,sbhku->sbhu", vec, Mi)
        assert_rel_close(got, want_v, f32_bound(S * (k + u) + k), "Mi^T k, Mi^T q")


@pytest.mark.parametrize("S,B,H,K,U,t", [(4, 2, 2, 5, 13, 2), (2, 2, 4, 64, 128, 0)])
def test_the_backward_pass_matches_the_reference(native, S, B, H, K, U, t):
    """`grad` (the two C++ passes composed) at step t of a stack, a reset row included, against
    the reference backend (`gpn_jax.kernels.xla`), each output relative to its norm with the
    float32 bound of its reduction length (`memory_reference.check_grad`)."""
    memory_reference.check_grad(native, "float32", (B, H, K, U, S), t, f32_bound(1))


def test_fused_window_gradients_through_the_memory_kernels_equal_autodiff(native, monkeypatch):
    """One predict layer, 4-step segments (4 of them), a random carry, document resets, and a
    term on the log decays (the window's other output): the loss, final carry and gradients
    against plain autodiff."""
    monkeypatch.setattr(fused_window, "MIN_SEGMENT", 4)
    ref, fused = pair(kernels="native", n_layers=1, n_heads=2, d_key=8, d_value=16)
    params, carry, x = random_params(ref), random_carry(ref), tokens(16)
    resets = jnp.zeros(x.shape, bool).at[0, 5].set(True).at[1, 8].set(True)

    def run(model):
        def f(p, c):
            loss, (c2, _) = model.loss(p, x, c, resets=resets)
            decay = model.predicted_states(p, x, c)[0].log_decay
            extra = sum(jnp.sum(jnp.sin(a)) for a in jax.tree.leaves(c2)) + jnp.sum(jnp.cos(decay))
            return loss + 0.1 * extra, (loss, c2)

        return jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True)).lower(params, carry)

    # the compared program itself calls every memory kernel (one lowering for check and run)
    lowered = run(fused)
    assert all(t in lowered.as_text() for t in memory.TARGETS)
    (_, (loss_r, carry_r)), grads_r = run(ref).compile()(params, carry)
    (_, (loss_f, carry_f)), grads_f = lowered.compile()(params, carry)
    bound = window_bound(16)  # T = 16 steps of contractions rounded in another order
    assert_rel_close(loss_f, loss_r, bound, "loss")
    assert_rel_close(carry_f, carry_r, bound, "carry")
    assert_rel_close(grads_f, grads_r, bound, "gradients")


@pytest.mark.parametrize(
    "kw,targets",
    [
        (dict(n_layers=1), {STEP, STACK, REDUCE, UPDATE}),
        (dict(n_layers=2), {STEP, STACK}),  # the passes take one layer's query
        (dict(n_layers=1, remat_segment=3), {STEP, STACK, REDUCE, UPDATE}),  # forward rerun
        (dict(n_layers=1, memory_dtype="bfloat16"), set()),  # the kernels store float32
    ],
)
def test_which_windows_use_the_memory_kernels(native, kw, targets):
    """With `model.kernels=native`: which memory kernels the backward calls; `xla` calls none."""
    x = tokens(9)
    model = pair(kernels="native", **kw)[1]
    params = model.init(jax.random.PRNGKey(0))
    hlo = fused_grad_hlo(model, params, x, random_carry(model))
    assert {t for t in memory.TARGETS if t in hlo} == targets
    model = pair(kernels="xla", **kw)[1]
    assert not any(
        t in fused_grad_hlo(model, params, x, random_carry(model)) for t in memory.TARGETS
    )
