"""Gated DeltaNet baseline: carry across windows, decoding, chunked vs recurrent, init, tracing."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpn_jax.models.factory import build_model
from gpn_jax.models.gdn import GatedDeltaNet, GDNConfig
from tests.helpers.window import f32_bound
from tests.tolerance import assert_rel_close, rel_err

V, D, L, H, K, U, F = 64, 32, 2, 2, 8, 16, 48


def make(**kw) -> GatedDeltaNet:
    args = dict(
        vocab_size=V, d_model=D, n_layers=L, n_heads=H, d_key=K, d_value=U, d_ffn=F,
        chunk_size=8, loss_chunk=4,
    )  # fmt: skip
    return GatedDeltaNet(GDNConfig(**(args | kw)))


def tokens(key=0, B=2, T=20):
    return jax.random.randint(jax.random.PRNGKey(key), (B, T), 0, V)


def perturb(params, seed=7, scale=0.3):
    """Moves every weight off its init (the zero-ish output projections would hide bugs).
    NumPy noise: nothing to compile."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda p: p + scale * rng.standard_normal(p.shape, np.float32), params)


class Jitted:
    """The model's entry points, jitted once per module so equal shapes share a compile."""

    def __init__(self, m):
        self.init = jax.jit(m.init)
        self.loss = jax.jit(m.loss)
        self.token_losses = jax.jit(m.token_losses)
        self.logits = jax.jit(m.logits)
        self.start_decode = jax.jit(m.start_decode, static_argnames="batch_size")
        self.decode_step = jax.jit(m.decode_step)


@pytest.fixture(scope="module")
def model_params():
    m = make()
    j = Jitted(m)
    return m, perturb(j.init(jax.random.PRNGKey(0))), j


# Two computations of a 20-step window that round differently (chunked vs recurrent, decoded
# vs whole-window): 20 steps of contractions at most V long, eps x 20 * V x 4.
WINDOW = f32_bound(20 * V)


def close(actual, desired, bound=WINDOW):
    """Leaf by leaf, relative to the leaf's norm (tests/tolerance.py)."""
    assert_rel_close(actual, desired, bound)


def test_two_windows_with_carry_equal_one(model_params):
    m, params, j = model_params
    x = tokens(1, T=20)  # windows of 10: one full chunk of 8 + a padded partial one
    ce_full, carry_full = j.token_losses(params, x, m.init_state(2))
    ce_a, carry = j.token_losses(params, x[:, :10], m.init_state(2))
    ce_b, carry = j.token_losses(params, x[:, 10:], carry)
    close(jnp.concatenate([ce_a, ce_b], 1), ce_full)
    close(carry, carry_full)
    loss_full, (carry_loss, metrics) = j.loss(params, x, m.init_state(2))
    assert rel_err(loss_full, ce_full.mean()) <= WINDOW
    assert set(metrics) >= {"loss", "state_rms"}
    close(carry_loss, carry_full)


def test_causal(model_params):
    m, params, j = model_params
    x = tokens(2, T=10)
    y = x.at[:, 5].set((x[:, 5] + 1) % V)
    (a, _), (b, _) = j.logits(params, x, m.init_state(2)), j.logits(params, y, m.init_state(2))
    close(a[:, :6], b[:, :6])  # position t reads tokens[:, :t] only
    assert np.abs(a[:, 6] - b[:, 6]).max() > 1e-3


def test_decode_matches_full_forward(model_params):
    m, params, j = model_params
    x = tokens(3, T=10)
    _, carry = j.token_losses(params, tokens(4, T=10), m.init_state(2))  # a non-trivial carry
    full, _ = j.logits(params, x, carry)
    step = j.decode_step
    logits, state = j.start_decode(params, carry)
    got = [logits]
    for t in range(x.shape[1] - 1):
        logits, state = step(params, state, x[:, t])
        got.append(logits)
    close(jnp.stack(got, 1), full)
    fresh, _ = j.start_decode(params, None, batch_size=2)
    close(fresh, j.logits(params, x, m.init_state(2))[0][:, 0])


def test_chunked_loss_equals_recurrent_loss(model_params):
    m, params, j = model_params
    rec = GatedDeltaNet(dataclasses.replace(m.config, chunk_size=0))
    x = tokens(5, T=20)
    _, carry = j.token_losses(params, tokens(6, T=10), m.init_state(2))

    def loss_and_grad(model):
        return jax.jit(jax.value_and_grad(model.loss, has_aux=True))(params, x, carry)

    (l_c, (c_c, _)), g_c = loss_and_grad(m)
    (l_r, (c_r, _)), g_r = loss_and_grad(rec)
    assert rel_err(l_c, l_r) <= WINDOW
    close(c_c, c_r)
    close(g_c, g_r, f32_bound(20 * V + 20 * 2))  # + the weight gradients' sums over B * T


def test_loss_at_init_is_log_vocab(model_params):
    m, _, j = model_params
    loss, _ = j.loss(j.init(jax.random.PRNGKey(1)), tokens(11, T=20), m.init_state(2))
    assert abs(float(loss) - math.log(V)) < 0.05


def test_jit_traces_once_per_shape(model_params):
    m, params, j = model_params
    traces = []

    def loss(p, x, c):
        traces.append(1)
        return m.loss(p, x, c)

    f = jax.jit(loss)
    carry = m.init_state(2)
    _, (carry, _) = f(params, tokens(8, T=20), carry)
    f(params, tokens(9, T=20), carry)
    assert len(traces) == 1


def test_bf16_compute_runs(model_params):
    m, params, _ = model_params
    bf = GatedDeltaNet(dataclasses.replace(m.config, compute_dtype="bfloat16"))
    loss, (carry, _) = jax.jit(bf.loss)(params, tokens(10, T=20), m.init_state(2))
    assert np.isfinite(loss) and carry.S[0].dtype == jnp.float32


@pytest.mark.slow
def test_remat_bf16_gradients_finite():
    m = make(compute_dtype="bfloat16", remat=True)
    params = m.init(jax.random.PRNGKey(0))
    loss, grads = jax.jit(jax.value_and_grad(lambda p: m.loss(p, tokens(10, T=20))[0]))(params)
    assert np.isfinite(loss) and all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
    assert jax.tree.leaves(grads)[0].dtype == jnp.float32


def test_weight_decay_mask_and_factory(model_params):
    m, params, j = model_params
    mask = m.weight_decay_mask(params)
    lay = mask["layer_0"]
    assert mask["embed"] and lay["wq"] and lay["wo"] and lay["w1"] and lay["wa"]
    for name in ("attn_norm", "o_norm", "mlp_norm", "A_log", "dt_bias", "conv_q", "conv_v"):
        assert not lay[name], name
    assert not mask["final_norm"]
    built = build_model(dict(family="gdn", vocab_size=V, d_model=D, n_layers=1, n_heads=H,
                             d_key=K, d_value=U, d_ffn=F))  # fmt: skip
    assert isinstance(built, GatedDeltaNet)


def test_flops_per_token():
    m = make()
    f = m.flops_per_token(64)
    assert f["train"] == 3 * f["forward"] > 0
    assert m.flops_per_token(64)["forward"] > make(chunk_size=0).flops_per_token(64)["forward"]


def test_negative_eigenvalues_option(model_params):
    """`negative_eigenvalues=True` doubles beta into [0, 2] (Grazzi et al. 2024): with the beta
    projection scaled up, some betas exceed 1 and the chunked loss, carry and gradients still
    equal the recurrent form's; the option changes the output (so it is wired in)."""
    from gpn_jax.models import gdn

    m, _, j = model_params  # make(): the option off
    neg = make(negative_eigenvalues=True)
    params = perturb(jax.jit(neg.init)(jax.random.PRNGKey(2)))
    params = {**params, "layer_0": {**params["layer_0"], "wb": 8.0 * params["layer_0"]["wb"]}}
    n = gdn.rms_norm(
        jnp.take(params["embed"], tokens(3, T=20), axis=0), params["layer_0"]["attn_norm"]
    )
    beta = 2.0 * jax.nn.sigmoid(n @ params["layer_0"]["wb"])
    assert float(beta.max()) > 1.5 and float(beta.min()) < 0.5
    rec = GatedDeltaNet(dataclasses.replace(neg.config, chunk_size=0))
    x = tokens(3, T=20)

    def loss_and_grad(model):
        return jax.jit(jax.value_and_grad(model.loss, has_aux=True))(params, x)

    (l_c, (c_c, _)), g_c = loss_and_grad(neg)
    (l_r, (c_r, _)), g_r = loss_and_grad(rec)
    assert rel_err(l_c, l_r) <= WINDOW
    close(c_c, c_r)
    close(g_c, g_r, f32_bound(20 * V + 20 * 2))
    l_pos, _ = j.loss(params, x, m.init_state(2))  # the module's compiled loss, option off
    assert rel_err(l_pos, l_c) > 1e-3
