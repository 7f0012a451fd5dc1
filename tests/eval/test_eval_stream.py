"""Streaming long-context eval (carry across windows) and windowed held-out PPL."""

import functools
import math

import jax
import numpy as np
import pytest

from gpn_jax.data.windows import WindowIterator
from gpn_jax.eval import ppl, stream
from tests.helpers.eval_models import GDN, GPN_M, TF, V, ce_bound
from tests.helpers.eval_models import build as build_model
from tests.tolerance import assert_rel_close, f32_bound


@functools.cache
def _built(items):
    return build_model(dict(items))


def build(cfg):
    """(model, params) of a config, built once for the tests that read them (JAX arrays cannot
    be changed in place): one model object, so its jitted evaluations compile once."""
    return _built(tuple(sorted(cfg.items())))


def tokens(n, seed=0):
    return np.random.default_rng(seed).integers(0, V, n).astype(np.int32)


def test_parse_buckets():
    assert stream.parse_buckets("0,2k,8k,32k") == [0, 2048, 8192, 32768]
    assert stream.parse_buckets("64,128") == [0, 64, 128]
    assert stream.parse_buckets([0, 10]) == [0, 10]
    for bad in ("0,2x", "0,8k,2k", ""):
        with pytest.raises(ValueError, match="bucket edge"):
            stream.parse_buckets(bad)


@pytest.mark.parametrize("cfg", [GPN_M, GDN], ids=["gpn_m", "gdn"])
def test_streaming_with_carry_equals_one_long_window(cfg):
    model, params = build(cfg)
    x = tokens(2 * 96).reshape(2, 96)
    streamed = stream.stream_token_losses(model, params, x, window=32, carry=True)
    whole, _ = jax.jit(model.token_losses)(params, x)
    # relative to the norm (tests/tolerance.py): 96 positions of the recurrence
    assert_rel_close(streamed, np.asarray(whole), ce_bound(96), "streamed CE")
    reset = stream.stream_token_losses(model, params, x, window=32, carry=False)
    assert not np.allclose(reset[:, 32:], streamed[:, 32:])  # the carry matters
    assert_rel_close(reset[:, :32], streamed[:, :32], ce_bound(32), "first window")


def test_buckets_of_a_recurrent_model():
    model, params = build(GPN_M)
    r = stream.stream_eval(model, params, tokens(300), window=32, buckets="0,64,128,1k")
    # 300 tokens -> one stream of 9 windows (288 tokens); the last bucket is cut at 288
    assert r["mode"] == "carried" and r["stream_tokens"] == 288
    assert list(r["buckets"]) == ["0-64", "64-128", "128-288"]
    assert [b["tokens"] for b in r["buckets"].values()] == [64, 64, 160]
    ce = stream.stream_token_losses(model, params, tokens(300)[:288][None], 32)
    # the same float32 CE program on both sides, averaged in float64: only float64 rounding of
    # the 288-term means differs (288 x 2**-52, x10)
    f64 = 10 * 288 * 2.0**-52
    assert r["buckets"]["64-128"]["loss"] == pytest.approx(ce[:, 64:128].mean(), rel=f64)
    assert r["overall"]["ppl"] == pytest.approx(math.exp(ce.mean()), rel=f64 * ce.mean())
    assert set(r["reset"]["buckets"]) == set(r["buckets"])
    assert r["reset"]["buckets"]["0-64"]["loss"] != r["buckets"]["0-64"]["loss"]  # 2nd window
    r2 = stream.stream_eval(model, params, tokens(300), window=32, buckets="0,64", num_streams=2)
    assert r2["streams"] == 2 and r2["stream_tokens"] == 64 and r2["overall"]["tokens"] == 128


def test_transformer_reports_its_fixed_window_number():
    model, params = build(TF)
    x = tokens(128)
    r = stream.stream_eval(model, params, x, window=32, buckets="0,64,128")
    assert r["mode"] == "fixed_window" and "reset" not in r
    restarted = np.asarray(jax.jit(model.token_losses)(params, x.reshape(4, 32))[0])
    # another program for the same windows: attention over 32 positions, widths <= d_ffn = 64,
    # the V-way logsumexp, then the mean over the bucket's 64 tokens; x2
    bound = f32_bound(32 + 64 + V + 64, 2)
    assert r["buckets"]["64-128"]["loss"] == pytest.approx(restarted[2:].mean(), rel=bound)


def test_stream_too_short():
    model, params = build(GPN_M)
    with pytest.raises(ValueError, match="stream too short"):
        stream.stream_eval(model, params, tokens(20), window=32)


def test_windows_ppl_is_exp_mean_model_loss():
    model, params = build(GPN_M)
    heldout = tokens(5 * 4 * 16 + 7, seed=1)  # 20 windows of 16 and a ragged tail
    it = lambda: WindowIterator(heldout, 4, 16, layout="sequential", repeat=False)
    r = ppl.windows_ppl(model, params, it())
    loss = jax.jit(lambda p, x: model.loss(p, x)[0])
    losses = [float(loss(params, b)) for b in it()]
    assert len(losses) == 5 and r["windows"] == 20 and r["tokens"] == 20 * 16
    # another program for the same batches (16 positions each) and a 5-term mean: exp turns
    # the mean loss's absolute error (its size x its relative error) into the PPL's
    bound = np.mean(losses) * (ce_bound(16) + f32_bound(4 * 16, 1))
    assert r["ppl"] == pytest.approx(math.exp(np.mean(losses)), rel=bound)
    assert ppl.windows_ppl(model, params, it(), max_batches=2)["windows"] == 8
    with pytest.raises(ValueError, match="no held-out windows"):
        ppl.windows_ppl(model, params, [])
