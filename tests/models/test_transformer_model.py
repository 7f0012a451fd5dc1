"""Transformer++ baseline: decoding, loss, causality, parameter accounting, tracing."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gpn_jax.models.factory import build_model
from gpn_jax.models.transformer import Transformer, TransformerConfig
from tests.helpers.window import f32_bound
from tests.tolerance import assert_rel_close, rel_err

V, D, L, H, F, S = 64, 32, 2, 4, 48, 16
# decoding step by step vs the whole window: per layer contractions at most F long and
# attention over at most S positions, then the V-long logits, rounded in another order
DECODE = f32_bound(L * (F + S) + V)


def make(**kw) -> Transformer:
    args = dict(
        vocab_size=V, d_model=D, n_layers=L, n_heads=H, d_ffn=F, max_seq_len=S, loss_chunk=4
    )
    return Transformer(TransformerConfig(**(args | kw)))


def tokens(key=0, B=2, T=S):
    return jax.random.randint(jax.random.PRNGKey(key), (B, T), 0, V)


def n_params(params) -> int:
    return sum(p.size for p in jax.tree.leaves(params))


@pytest.fixture(scope="module")
def model_params():
    m = make()
    return m, m.init(jax.random.PRNGKey(0))


def test_kv_decode_matches_full_forward(model_params):
    m, params = model_params
    x = tokens(1)
    full, _ = jax.jit(m.logits)(params, x)
    step = jax.jit(m.decode_step)
    start = jax.jit(m.start_decode, static_argnames="batch_size")
    logits, state = start(params, m.init_state(2), batch_size=2)
    got = [logits]
    for t in range(S - 1):
        logits, state = step(params, state, x[:, t])
        got.append(logits)
    assert_rel_close(np.stack(got, 1), full, DECODE, "decoded logits")
    assert int(state["pos"]) == S


def test_decode_broadcasts_a_batch_one_start(model_params):
    m, params = model_params
    x = tokens(2, B=3, T=4)
    full, _ = jax.jit(m.logits)(params, x)
    logits, state = jax.jit(m.start_decode)(params, None)  # batch 1: BOS is the same for all
    assert_rel_close(logits[0], full[0, 0], DECODE, "BOS logits")
    logits, state = jax.jit(m.decode_step)(params, state, x[:, 0])
    assert logits.shape == (3, V) and state["k"].shape[1] == 3
    assert_rel_close(logits, full[:, 1], DECODE, "first step")


def test_loss_at_init_is_log_vocab(model_params):
    m, params = model_params
    loss, (carry, metrics) = jax.jit(m.loss)(params, tokens(3))
    assert carry is None and m.init_state(2) is None
    assert abs(float(loss) - math.log(V)) < 0.5
    assert float(metrics["loss"]) == float(loss)


@pytest.fixture(scope="module")
def full_logits_reference(model_params):
    """(tokens, per-token CE from the full logits, its plain gradient): one for every chunk."""
    m0, params = model_params
    x = tokens(4)
    full, _ = jax.jit(m0.logits)(params, x)
    ce = optax.softmax_cross_entropy_with_integer_labels(full, x)
    g_full = jax.jit(
        jax.grad(
            lambda p: optax.softmax_cross_entropy_with_integer_labels(m0.logits(p, x)[0], x).mean()
        )
    )(params)
    return x, ce, g_full


@pytest.mark.parametrize("chunk", [4, 5, 0])
def test_chunked_loss_equals_full_logits(model_params, full_logits_reference, chunk):
    _, params = model_params
    m = make(loss_chunk=chunk)
    x, ce, g_full = full_logits_reference
    # the loss and its gradient from one program
    loss, g_chunk = jax.jit(jax.value_and_grad(lambda p: m.loss(p, x)[0]))(params)
    # the same logits; chunks may reorder one contraction (V long) and the mean over B * S
    assert_rel_close(loss, ce.mean(), f32_bound(V + 2 * S), "loss")
    per_tok, _ = jax.jit(m.token_losses)(params, x)
    assert_rel_close(per_tok, ce, f32_bound(V), "per-token CE")
    # gradients through the chunked, rematerialised loss agree with the plain one
    assert_rel_close(g_chunk, g_full, f32_bound(V + 2 * S), "gradients")


def test_causality(model_params):
    m, params = model_params
    x = tokens(5)
    t = 7
    y = x.at[:, t].set((x[:, t] + 1) % V)
    logits = jax.jit(m.logits)
    a, _ = logits(params, x)
    b, _ = logits(params, y)
    # logits[:, s] predict token s from tokens[:, :s]: positions <= t cannot see token t
    assert rel_err(a[:, : t + 1], b[:, : t + 1]) <= f32_bound(V)  # the same math
    assert np.abs(a[:, t + 1] - b[:, t + 1]).max() > 1e-6


def test_tied_vs_untied_param_count():
    tied = make().init(jax.random.PRNGKey(0))
    untied = make(tie_embeddings=False).init(jax.random.PRNGKey(0))
    assert "head" in untied and "head" not in tied
    assert n_params(untied) - n_params(tied) == V * D
    # 4d^2 attention + 3 d f MLP + 2 norms per layer, embedding, final norm
    assert n_params(tied) == L * (4 * D * D + 3 * D * F + 2 * D) + V * D + D


def test_untied_and_remat_and_bf16_run():
    x = tokens(6)
    base = make(tie_embeddings=False)
    params = base.init(jax.random.PRNGKey(1))
    # loss and gradients from one program per model (not one for each)
    value_and_grad = lambda m: jax.jit(jax.value_and_grad(lambda p: m.loss(p, x)[0]))(params)
    loss, g0 = value_and_grad(base)
    remat_loss, g = value_and_grad(make(tie_embeddings=False, remat=True))
    assert rel_err(remat_loss, loss) <= f32_bound(V)  # the same math, rerun
    assert_rel_close(g, g0, f32_bound(V + 2 * S), "remat gradients")  # + sums over B * S
    bf = make(tie_embeddings=False, compute_dtype="bfloat16")
    bf_loss, _ = jax.jit(bf.loss)(params, x)
    assert abs(float(bf_loss) - float(loss)) < 0.05
    logits, state = jax.jit(bf.start_decode, static_argnames="batch_size")(
        params, None, batch_size=2
    )
    assert logits.dtype == jnp.float32 and state["k"].dtype == jnp.bfloat16


def test_jit_traces_once_per_shape(model_params):
    m, params = model_params

    @jax.jit
    @chex.assert_max_traces(n=1)
    def loss_fn(p, x):
        return m.loss(p, x)[0]

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(p, state, tok):
        return m.decode_step(p, state, tok)

    for k in range(3):
        loss_fn(params, tokens(k))
    _, state = jax.jit(m.start_decode, static_argnames="batch_size")(params, None, batch_size=2)
    for t in range(4):
        _, state = step(params, state, tokens(t)[:, t])


def test_weight_decay_mask_and_flops(model_params):
    m, params = model_params
    mask = m.weight_decay_mask(params)
    assert mask["embed"] and mask["layer_0"]["wq"] and mask["layer_1"]["w2"]
    assert not mask["final_norm"] and not mask["layer_0"]["attn_norm"]
    assert not mask["layer_0"]["mlp_norm"]
    fl = m.flops_per_token(S)
    expect = 2 * (L * (4 * D * D + 3 * D * F + S * D) + D * V)
    assert fl["forward"] == expect and fl["train"] == 3 * expect
    assert m.flops_per_token() == fl  # defaults to max_seq_len


def test_factory_builds_transformer():
    m = build_model(
        dict(
            family="transformer",
            vocab_size=V,
            d_model=D,
            n_layers=1,
            n_heads=2,
            d_ffn=F,
            max_seq_len=8,
        )
    )
    assert isinstance(m, Transformer) and m.config.n_layers == 1


def test_config_validation():
    with pytest.raises(ValueError):
        make(n_heads=5)
    with pytest.raises(TypeError):
        make(bogus=1)


def test_attention_choice():
    """'auto' takes cuDNN's fused kernel only on a GPU (16-bit queries, head dim a multiple of 8
    up to 128); here, on the CPU, XLA's, and the loss is the explicit 'xla' one bit for bit.
    An explicit 'cudnn' off a GPU, or an unknown choice, is refused in one line."""
    from gpn_jax.models.transformer import attention_impl

    q16 = jnp.zeros((1, 4, 2, 64), jnp.bfloat16)
    assert jax.default_backend() == "cpu"
    assert attention_impl("auto", q16) == "xla" and attention_impl("xla", q16) == "xla"
    with pytest.raises(ValueError, match="needs a GPU .cuDNN.; this backend is cpu"):
        attention_impl("cudnn", q16)
    with pytest.raises(ValueError, match="attention must be 'auto', 'xla' or 'cudnn'"):
        make(attention="flash")
    losses = {}
    for choice in ("auto", "xla"):
        m = make(attention=choice)
        params = m.init(jax.random.PRNGKey(0))
        losses[choice] = float(jax.jit(m.loss)(params, tokens())[0])
    assert losses["auto"] == losses["xla"]


def test_auto_attention_falls_back_to_xla_with_one_warning_where_cudnn_refuses(monkeypatch, caplog):
    """On a GPU whose cuDNN refuses (here: a CPU posing as a GPU, so cuDNN is not found, or,
    where the CUDA wheels are installed, found but not lowerable for the CPU), 'auto' trains
    with XLA's attention, the same loss bit for bit, and says so once; an explicit 'cudnn'
    raises that error."""
    from gpn_jax.models import transformer

    params = make(compute_dtype="bfloat16").init(jax.random.PRNGKey(0))
    want = float(make(compute_dtype="bfloat16", attention="xla").loss(params, tokens())[0])
    monkeypatch.setattr(transformer, "_backend", lambda: "gpu")
    transformer._warn_cudnn_fallback.cache_clear()
    with caplog.at_level("WARNING"):
        got = float(make(compute_dtype="bfloat16").loss(params, tokens())[0])
    assert got == want
    warned = [r.message for r in caplog.records if "cuDNN's fused attention" in r.message]
    assert len(warned) == 1 and "model.attention=xla" in warned[0]
    with pytest.raises(RuntimeError, match="cuDNN|for platform cpu"):
        make(compute_dtype="bfloat16", attention="cudnn").loss(params, tokens())
