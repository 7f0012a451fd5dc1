"""Per-token document resets inside the scan (stateful training, issue #15), for GPN, GPN+M
(autodiff and fused windows) and Gated DeltaNet (chunked and recurrent delta rule).

Bounds are norm-relative (`tests.tolerance`), float32 eps x the reduction length rounded in
another order x a margin (`tests.helpers.window.f32_bound`).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpn_jax.core.fused import window as fused_window
from gpn_jax.models.base import document_starts, reset_after_eos
from gpn_jax.models.gdn import GatedDeltaNet, GDNConfig
from gpn_jax.models.gpn import GPN, GPNConfig
from tests.helpers import window as fw_tests
from tests.helpers.window import f32_bound, random_params, window_bound
from tests.tolerance import assert_rel_close

V, EOS = 32, 3


def gpn(memory=True, scan_impl="autodiff"):
    mem = dict(n_heads=2, d_key=4, d_value=4) if memory else dict(memory=False)
    return GPN(
        GPNConfig(
            vocab_size=V, d_model=16, d_emb=8, d_ffn=16, n_layers=2, loss_chunk=4,
            scan_impl=scan_impl, **mem,
        )
    )  # fmt: skip


def gdn(chunk_size=4):
    return GatedDeltaNet(
        GDNConfig(
            vocab_size=V, d_model=16, n_layers=1, n_heads=2, d_key=4, d_value=4, d_ffn=16,
            chunk_size=chunk_size, loss_chunk=4,
        )
    )  # fmt: skip


MODELS = {
    "gpn_m": lambda: gpn(),
    "gpn_m_fused": lambda: gpn(scan_impl="fused"),
    "gpn": lambda: gpn(memory=False),
    "gpn_fused": lambda: gpn(memory=False, scan_impl="fused"),
    "gdn_chunked": lambda: gdn(4),
    "gdn_recurrent": lambda: gdn(0),
}


def params_of(model, seed=0):
    """Every parameter randomised (zero gates and output projections at init hide bugs)."""
    return random_params(model, seed)


def losses(model, params, x, carry=None, resets=None):
    return jax.jit(model.token_losses)(params, x, carry, resets=resets)


@functools.cache
def built(name):
    """(model, randomised params, losses) of a MODELS entry, shared by the tests: one jitted
    `token_losses` per model, so a shape two tests run compiles once."""
    model = MODELS[name]()
    f = jax.jit(model.token_losses)
    return (
        model,
        params_of(model),
        lambda p, x, carry=None, resets=None: f(p, x, carry, resets=resets),
    )


def tokens(B=2, T=12, seed=0):
    """Random tokens that avoid EOS (each test places its own separators)."""
    t = np.random.default_rng(seed).integers(EOS + 1, V, (B, T))
    return jnp.asarray(t, jnp.int32)


@pytest.mark.parametrize("name", MODELS)
def test_reset_everywhere_is_the_per_token_zero_state_model(name):
    _, params, losses = built(name)
    x = tokens(T=6)
    ce, _ = losses(params, x, resets=jnp.ones(x.shape, bool))
    alone = [losses(params, x[:, t : t + 1])[0] for t in range(x.shape[1])]
    # per position the same math; the window may reorder one contraction (at most V long)
    assert_rel_close(ce, jnp.concatenate(alone, axis=1), f32_bound(V), name)


# Documents that end with EOS (so the next one starts a document) and one that does not (last).
A, B, C = np.array([5, 9, 7, EOS]), np.array([13, EOS]), np.array([11, 6, 8, 20, 4, 17])


@pytest.mark.parametrize("name", MODELS)
def test_documents_with_resets_equal_documents_run_separately(name):
    """Rows A B C and B A C (documents start at 4, 6 and at 2, 6) against each document run
    alone from the zero state, the three as one batch padded at the end to C's length (a
    causal model: padding changes no earlier position; C, unpadded, gives the final carry).
    The rows' shape is the split test's whole window (one compiled program)."""
    _, params, losses = built(name)
    rows = np.stack([np.concatenate([A, B, C]), np.concatenate([B, A, C])])
    rows = jnp.asarray(rows, jnp.int32)
    ce, carry = losses(params, rows, resets=document_starts(rows, EOS))
    alone = np.full((3, len(C)), EOS + 1)
    for i, d in enumerate((A, B, C)):
        alone[i, : len(d)] = d
    ce_alone, carry_alone = losses(params, jnp.asarray(alone, jnp.int32))
    a, b, c = (ce_alone[i, : len(d)] for i, d in enumerate((A, B, C)))
    want = jnp.stack([jnp.concatenate([a, b, c]), jnp.concatenate([b, a, c])])
    # per position the same math; the window may reorder one contraction (at most V long)
    assert_rel_close(ce, want, f32_bound(V), name)
    want_carry = jax.tree.map(lambda x: jnp.stack([x[2], x[2]]), carry_alone)
    assert_rel_close(carry, want_carry, f32_bound(V), f"{name} final carry")


@pytest.mark.parametrize("name", MODELS)
def test_split_window_with_carry_equals_whole_window(name):
    """Forward: two halves with the carry passed == the whole window (resets inside both).
    Gradients: with a reset at the split the truncated-BPTT gradient (carry stopped) is exact."""
    model, params, losses = built(name)
    x = np.array(tokens(T=12))
    x[0, 2], x[1, 8] = EOS, EOS  # documents start inside each half
    x = jnp.asarray(x)
    r = document_starts(x, EOS)
    whole, carry = losses(params, x, resets=r)
    a, ca = losses(params, x[:, :6], model.init_state(x.shape[0]), r[:, :6])
    b, cb = losses(params, x[:, 6:], ca, r[:, 6:])
    # 12 steps of contractions (at most V long) rounded in another order
    assert_rel_close(jnp.concatenate([a, b], axis=1), whole, window_bound(12, V), name)
    assert_rel_close(cb, carry, window_bound(12, V), f"{name} carry")

    y = np.array(x)
    y[:, 5] = EOS  # every row's second half starts a document
    y = jnp.asarray(y)
    ry = document_starts(y, EOS)

    def whole_loss(p):
        return model.loss(p, y, resets=ry)[0]

    # Truncated BPTT: the mean of the halves' losses, the second from the first's final carry
    # (reset after EOS) with its gradient stopped, so the gradient is the mean of the halves'
    # gradients. One program (a half's gradient from a given carry) serves both halves.
    def half_loss(p, x, carry, resets):
        return model.loss(p, x, carry=carry, resets=resets)[0]

    half_grad = jax.jit(jax.grad(half_loss))
    zero = model.init_state(y.shape[0])
    _, c = losses(params, y[:, :6], zero, ry[:, :6])  # the forward program above
    c = reset_after_eos(model, c, y[:, :6], EOS)
    g1 = half_grad(params, y[:, :6], zero, ry[:, :6])
    g2 = half_grad(params, y[:, 6:], c, ry[:, 6:])
    gt = jax.tree.map(lambda a, b: (a + b) / 2, g1, g2)
    gw = jax.jit(jax.grad(whole_loss))(params)
    # the backward through 12 steps, weight gradients summed over them in another order
    assert_rel_close(gt, gw, window_bound(12, V), f"{name} gradients")


FUSED_CASES = {
    "L1": dict(n_layers=1),
    "L2-remat4": dict(n_layers=2, remat_segment=4),
    "L2-nomem": dict(n_layers=2, **fw_tests.NO_MEM),
}


@pytest.mark.parametrize("name", FUSED_CASES)
def test_fused_equals_autodiff_with_resets(name, monkeypatch):
    """Resets inside segments and on a segment's first step (memory checkpoints every 4
    steps), from a random carried state; cotangents also enter through the final carry."""
    monkeypatch.setattr(fused_window, "MIN_SEGMENT", 4)
    auto, fused = fw_tests.pair(**FUSED_CASES[name])
    params, x = random_params(auto), np.array(fw_tests.tokens(16)) % (V - EOS - 1) + EOS + 1
    x[0, [3, 7]], x[1, 15] = EOS, EOS  # resets at 4 (a segment start), 8 and nowhere
    x = jnp.asarray(x)
    r = document_starts(x, EOS)
    carry = fw_tests.random_carry(auto)

    def run(model):
        def f(p, c):
            loss, (out, _) = model.loss(p, x, c, resets=r)
            return loss + 0.1 * sum(jnp.sum(jnp.sin(v)) for v in jax.tree.leaves(out)), out

        return jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(params, carry)

    (va, oa), ga = run(auto)
    (vf, of), gf = run(fused)
    # 16 steps of contractions (at most V long) rounded in another order (`window_bound`)
    bound = window_bound(16, V)
    assert_rel_close(vf, va, bound, "loss")
    assert_rel_close(of, oa, bound, "final carry")
    assert_rel_close(gf, ga, bound, "gradients (params, incoming carry)")


def test_reset_after_eos_restores_the_initial_state_in_those_rows_only():
    model = gdn()
    x = jnp.asarray([[5, 6, EOS], [5, EOS, 6]], jnp.int32)
    carry = jax.jit(model.token_losses)(params_of(model), x)[1]
    out = reset_after_eos(model, carry, x, EOS)
    fresh = model.init_state(2)
    leaves = (jax.tree.leaves(t) for t in (out, carry, fresh))
    for o, c, f in zip(*leaves, strict=True):
        np.testing.assert_array_equal(o[0], f[0])
        np.testing.assert_array_equal(o[1], c[1])
    np.testing.assert_array_equal(
        document_starts(x, EOS), [[False, False, False], [False, False, True]]
    )
