"""Sampling filters, decode == full forward, greedy generation, O(1) decoding state."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpn_jax.eval import sampling
from gpn_jax.eval.sampling import SamplingConfig
from gpn_jax.models import factory
from tests.tolerance import assert_rel_close, f32_bound

V = 48
CONFIGS = {
    "gpn_m": dict(family="gpn", vocab_size=V, d_model=32, d_emb=16, d_ffn=64, n_heads=2,
                  d_key=8, d_value=8, n_layers=2, loss_chunk=12),
    "gpn": dict(family="gpn", vocab_size=V, d_model=32, d_emb=16, d_ffn=64, memory=False,
                n_heads=0, d_key=0, d_value=0, loss_chunk=12),
    "transformer": dict(family="transformer", vocab_size=V, d_model=32, n_layers=2, n_heads=2,
                        d_ffn=64, max_seq_len=16, loss_chunk=12),
    "gdn": dict(family="gdn", vocab_size=V, d_model=32, n_layers=1, n_heads=2, d_key=8,
                d_value=8, d_ffn=64, chunk_size=4, loss_chunk=12),
}  # fmt: skip
PROMPT = [5, 9, 3, 17, 17, 2, 40, 11, 0, 8, 30, 21]


@functools.cache
def build(name, seed=0):
    """(model, params), built once per (config, seed) for the tests that read them (JAX arrays
    cannot be changed in place)."""
    model = factory.build_model(CONFIGS[name])
    return model, model.init(jax.random.PRNGKey(seed))


def test_top_k_and_top_p_keep_the_right_sets():
    logits = jnp.log(jnp.array([[0.05, 0.5, 0.15, 0.3]]))
    kept = lambda f: np.isfinite(np.asarray(f)) & (np.asarray(f) > -1e30)
    assert kept(sampling.filter_logits(logits, top_k=2)).tolist() == [[False, True, False, True]]
    assert kept(sampling.filter_logits(logits, top_p=0.75)).tolist() == [[False, True, False, True]]
    assert kept(sampling.filter_logits(logits, top_p=0.85)).tolist() == [[False, True, True, True]]
    assert kept(sampling.filter_logits(logits, top_p=0.01)).tolist() == [
        [False, True, False, False]
    ]
    assert kept(sampling.filter_logits(logits)).all()


def test_sampling_modes():
    logits = jax.random.normal(jax.random.PRNGKey(1), (6, V)) * 3
    rng = jax.random.PRNGKey(0)
    argmax = np.asarray(jnp.argmax(logits, -1))
    for cfg in (
        SamplingConfig(greedy=True),
        SamplingConfig(temperature=0.0),
        SamplingConfig(top_k=1),
    ):
        np.testing.assert_array_equal(sampling.sample(rng, logits, cfg), argmax)
    cfg = SamplingConfig(temperature=0.7, top_k=5)
    a, b = sampling.sample(rng, logits, cfg), sampling.sample(rng, logits, cfg)
    np.testing.assert_array_equal(a, b)  # same seed, same tokens
    top5 = np.argsort(-np.asarray(logits), -1)[:, :5]
    keys = jax.random.split(rng, 50)
    draws = np.stack([np.asarray(sampling.sample(k, logits, cfg)) for k in keys])
    assert all(np.isin(draws[:, r], top5[r]).all() for r in range(6))
    assert len(np.unique(draws)) > 6  # actually samples
    for bad in (dict(temperature=-1), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError):
            SamplingConfig(**bad)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_decoding_a_prompt_step_by_step_equals_the_full_forward(name):
    model, params = build(name)
    tokens = jnp.asarray([PROMPT], jnp.int32)
    full, _ = jax.jit(model.logits)(params, tokens)
    out = sampling.generate(model, params, PROMPT, max_new_tokens=0)
    # relative to the norm (tests/tolerance.py): one token at a time vs one program over the
    # prompt (<= 16 positions) of reductions no longer than d_ffn = 64; x1 (the worst case)
    assert_rel_close(out["prompt_logits"], np.asarray(full[0]), f32_bound(16 * 64, 1), "logits")


@pytest.mark.parametrize("name", ["gpn_m", "transformer"])
def test_greedy_generation_is_the_argmax_of_the_full_forward(name):
    model, params = build(name, seed=2)
    prompt = PROMPT[:5]
    out = sampling.generate(model, params, prompt, 6, SamplingConfig(greedy=True), num_samples=2)
    assert out["tokens"][0] == out["tokens"][1] and len(out["tokens"][0]) == 6
    seq = jnp.asarray([prompt + out["tokens"][0]], jnp.int32)
    full, _ = jax.jit(model.logits)(params, seq)
    np.testing.assert_array_equal(np.argmax(full[0, len(prompt) :], -1), out["tokens"][0])


def test_gpn_decoding_state_is_constant_size():
    model, params = build("gpn_m")
    _, state = model.start_decode(params, batch_size=1)
    shapes = jax.tree.map(lambda a: a.shape, state)
    step = jax.jit(model.decode_step)
    for t in PROMPT:
        _, state = step(params, state, jnp.asarray([t], jnp.int32))
    assert jax.tree.map(lambda a: a.shape, state) == shapes


def test_sampling_is_seeded_and_stops_at_eos():
    model, params = build("gpn_m")
    cfg = SamplingConfig(temperature=1.5, top_p=0.95)
    a = sampling.generate(model, params, PROMPT[:3], 8, cfg, seed=1, num_samples=3)["tokens"]
    b = sampling.generate(model, params, PROMPT[:3], 8, cfg, seed=1, num_samples=3)["tokens"]
    assert a == b and len({tuple(r) for r in a}) > 1
    eos = a[0][2]
    cut = sampling.generate(model, params, PROMPT[:3], 8, cfg, seed=1, num_samples=3, eos_id=eos)
    assert cut["tokens"][0] == a[0][: a[0].index(eos) + 1]


def test_transformer_generation_stops_at_its_context():
    model, params = build("transformer")  # max_seq_len 16: BOS + 15 observed tokens
    out = sampling.generate(model, params, PROMPT, 10, SamplingConfig(greedy=True))
    assert out["truncated"] and len(out["tokens"][0]) == 16 - 1 - len(PROMPT) + 1
    with pytest.raises(ValueError, match="exceeds the model's context"):
        sampling.generate(model, params, PROMPT + PROMPT, 1)
