"""GPN / GPN+M against the paper's equations: an independent NumPy loop, carry semantics, and the training switches."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpn_jax.models.gpn import GPN, GPNConfig
from tests import spec_reference
from tests.helpers.window import f32_bound, random_params, window_bound
from tests.tolerance import assert_rel_close

V, B, T = 37, 2, 8


def tiny(**kw) -> GPNConfig:
    base = dict(vocab_size=V, d_model=16, d_emb=8, d_ffn=20, n_heads=3, d_key=4, d_value=5)
    return GPNConfig(**(base | kw))


def tokens(seed=0, b=B, t=T):
    return jax.random.randint(jax.random.PRNGKey(seed + 100), (b, t), 0, V)


CASES = [
    dict(n_layers=1),
    dict(n_layers=2),
    dict(n_layers=1, memory=False, n_heads=0, d_key=0, d_value=0),
    dict(n_layers=2, memory=False, n_heads=0, d_key=0, d_value=0),
    dict(n_layers=1, decoder_bias=True),
]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: str(kw))
def test_matches_independent_numpy_loop(kw):
    model = GPN(tiny(**kw))
    params = random_params(model)
    x = tokens()
    # one jitted program (op-by-op eager dispatch compiles many small ones)
    loss, logits = jax.jit(lambda p, x: (model.loss(p, x)[0], model.logits(p, x)[0]))(params, x)
    ref_logits, ref_ce = [], []
    for b in range(B):
        lg, ce, _ = spec_reference.run_sequence(jax.device_get(params), np.asarray(x[b]))
        ref_logits.append(lg)
        ref_ce.append(ce)
    # float32 JAX vs the float64 numpy loop (only one side rounds): T steps of contractions at
    # most V long, eps x T * V; the loss adds the mean over B * T positions
    assert_rel_close(logits, np.stack(ref_logits), f32_bound(T * V, margin=1.0), "logits")
    assert_rel_close(loss, np.mean(ref_ce), f32_bound(T * V + B * T, margin=1.0), "loss")


@pytest.mark.parametrize("memory", [True, False])
def test_two_windows_with_carry_equal_one_long_window(memory):
    kw = {} if memory else dict(memory=False, n_heads=0, d_key=0, d_value=0)
    model = GPN(tiny(n_layers=2, **kw))
    params = random_params(model)
    x = tokens(t=2 * T)
    token_losses = jax.jit(model.token_losses)
    ce_full, carry_full = token_losses(params, x)
    ce_a, carry = token_losses(params, x[:, :T])
    ce_b, carry = token_losses(params, x[:, T:], carry)
    # the same operations; another compilation may reorder one contraction (at most V long)
    assert_rel_close(jnp.concatenate([ce_a, ce_b], 1), ce_full, f32_bound(V), "CE")
    assert_rel_close(carry, carry_full, f32_bound(V), "carry")


@pytest.mark.parametrize("memory", [True, False])
def test_step_by_step_decoding_equals_full_window(memory):
    kw = {} if memory else dict(memory=False, n_heads=0, d_key=0, d_value=0)
    model = GPN(tiny(n_layers=2, **kw))
    params = random_params(model)
    x = tokens()
    full, _ = jax.jit(model.logits)(params, x)
    step = jax.jit(model.decode_step)
    lg, state = jax.jit(model.start_decode)(params, model.init_state(B))
    stepped = [lg]
    for t in range(T - 1):
        lg, state = step(params, state, x[:, t])
        stepped.append(lg)
    # T steps of contractions rounded in another order (one step at a time vs the scan)
    assert_rel_close(jnp.stack(stepped, 1), full, window_bound(T), "logits")


def test_chunked_loss_equals_unchunked():
    x = tokens(t=12)
    ref = GPN(tiny(loss_chunk=0))
    params = random_params(ref)
    # the logits and the unchunked gradients from one program
    full_logits, ref_grads = jax.jit(
        lambda p: (ref.logits(p, x)[0], jax.grad(lambda q: ref.loss(q, x)[0])(p))
    )(params)
    direct = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(full_logits), x[..., None], -1))
    for chunk in (1, 5):  # 5 does not divide 12: the largest divisor below it (4) is used
        model = GPN(tiny(loss_chunk=chunk))
        loss, grads = jax.jit(jax.value_and_grad(lambda p, m=model: m.loss(p, x)[0]))(params)
        # chunks reorder the sum over the B * 12 positions (and the decode gradient's)
        assert_rel_close(loss, direct, f32_bound(B * 12 + V), "loss")
        assert_rel_close(grads, ref_grads, f32_bound(B * 12 + V), f"gradients, chunk {chunk}")


@functools.cache
def plain_loss_and_grads():
    """(params, loss, gradients) without remat: one compile for every remat segment."""
    plain = GPN(tiny(n_layers=2))
    params = random_params(plain)
    (l0, _), g0 = jax.jit(jax.value_and_grad(plain.loss, has_aux=True))(params, tokens())
    return params, l0, g0


@pytest.mark.parametrize("segment", [2, 4])
def test_remat_changes_neither_loss_nor_gradients(segment):
    x = tokens()
    remat = GPN(tiny(n_layers=2, remat_segment=segment))
    params, l0, g0 = plain_loss_and_grads()
    (l1, _), g1 = jax.jit(jax.value_and_grad(remat.loss, has_aux=True))(params, x)
    # the same operations rerun; the segmented backward may reorder the weight gradients' sums
    # over T * B positions
    assert_rel_close(l1, l0, f32_bound(V), "loss")
    assert_rel_close(g1, g0, f32_bound(T * B + V), "gradients")


def test_remat_segment_must_divide_sequence_length():
    model = GPN(tiny(remat_segment=3))
    params = model.init(jax.random.PRNGKey(0))
    with pytest.raises(
        ValueError, match="sequence length 8 is not divisible by the remat segment 3"
    ):
        model.loss(params, tokens())


def test_bfloat16_compute_keeps_float32_state_and_close_loss():
    x = tokens(t=16)
    f32 = GPN(tiny(n_layers=2))
    bf16 = GPN(tiny(n_layers=2, compute_dtype="bfloat16"))
    params = random_params(f32)
    l32, (c32, _) = jax.jit(f32.loss)(params, x)
    l16, (c16, _) = jax.jit(bf16.loss)(params, x)
    assert c16.s.dtype == c16.M.dtype == jnp.float32
    assert abs(float(l16) / float(l32) - 1) < 0.02
    assert float(l16) != float(l32)  # bf16 really ran


def test_train_step_compiles_once_per_shape():
    model = GPN(tiny())
    params = model.init(jax.random.PRNGKey(0))

    @jax.jit
    @chex.assert_max_traces(n=1)
    def grad_fn(p, x):
        return jax.grad(lambda q: model.loss(q, x)[0])(p)

    for seed in range(3):
        grad_fn(params, tokens(seed))
    with pytest.raises(AssertionError):
        grad_fn(params, tokens(0, t=2 * T))


def test_initialisation_follows_spec():
    model = GPN(tiny(n_layers=2, n_heads=64))
    p = model.init(jax.random.PRNGKey(0))
    for name in ("w2", "wpg", "bpg", "bq"):
        assert not np.any(p["layer_1"][name])
    assert not np.any(p["ground"]["gate_w"]) and not np.any(p["ground"]["gate_b"])
    assert not np.any(p["write"]["bk"])
    a = np.exp(p["write"]["A_log"])
    assert a.min() > 0 and a.max() <= 16 and a.max() > 8
    dt = np.log1p(np.exp(p["write"]["dt_bias"]))
    assert dt.min() >= 1e-4 - 1e-9 and dt.max() <= 0.1 + 1e-6
    assert abs(float(np.std(p["embed"])) - 0.02) < 0.005
    assert abs(float(np.std(p["layer_0"]["wo"])) - 0.02) < 0.005
    np.testing.assert_array_equal(p["decode"]["norm"], 1.0)


def test_weight_decay_mask_is_matrices_only():
    model = GPN(tiny(decoder_bias=True))
    p = model.init(jax.random.PRNGKey(0))
    mask = model.weight_decay_mask(p)
    flat = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(mask)}
    assert flat["['embed']"] and flat["['layer_0']['w1']"] and flat["['write']['wk']"]
    for key in (
        "['write']['A_log']",
        "['write']['dt_bias']",
        "['decode']['bias']",
        "['layer_0']['ffn_norm']",
        "['layer_0']['bq']",
        "['ground']['gate_b']",
    ):
        assert not flat[key], key


def test_loss_at_init_is_near_log_vocab():
    model = GPN(tiny())
    loss, _ = jax.jit(model.loss)(model.init(jax.random.PRNGKey(0)), tokens())
    assert abs(float(loss) - np.log(V)) < 0.1
