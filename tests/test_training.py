"""The training system: bit-identical resume, accumulation, outputs, divergence, corrupt checkpoints."""

import glob
import json
import os

import chex
import jax
import numpy as np
import pytest

from experiments.configs import gpn_m_tiny
from gpn_jax.models import factory
from gpn_jax.training import train_step as ts
from gpn_jax.training.checkpointing import Checkpointer
from gpn_jax.training.loop import TrainingError, train_and_evaluate
from gpn_jax.training.optimizer import make_optimizer


def tiny_config(**train):
    c = gpn_m_tiny.get_config()
    c.train.update(
        dict(batch_size=8, steps=4, checkpoint_every=2, eval_every=0, log_every=1, eval_batches=2)
    )
    c.train.final_eval_batches = 2
    c.train.update(train)
    return c


def final_state(workdir, config):
    model = factory.build_model(config.model)
    opt = make_optimizer(config.train, model.weight_decay_mask)
    abstract = jax.eval_shape(lambda r: ts.init_train_state(model, opt, r), jax.random.PRNGKey(0))
    with Checkpointer(workdir, async_save=False, cleanup_tmp=False) as ckpt:
        step, state, data_state, _, meta = ckpt.restore(abstract)
    return step, state, data_state, meta


def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path):
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    train_and_evaluate(tiny_config(steps=4), straight)
    train_and_evaluate(tiny_config(steps=2), resumed)
    train_and_evaluate(tiny_config(steps=4), resumed)  # same command again: resumes at step 2
    s1, a, data_a, meta_a = final_state(straight, tiny_config())
    s2, b, data_b, meta_b = final_state(resumed, tiny_config())
    assert s1 == s2 == 4
    chex.assert_trees_all_equal(a, b)
    assert data_a == data_b and meta_a == meta_b
    # What the user sees: metrics as JSONL and TensorBoard events, final metrics with both PPLs.
    rows = [json.loads(line) for line in open(os.path.join(straight, "metrics.jsonl"))]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]
    assert all({"loss", "lr", "tokens_per_s", "grad_norm"} <= set(r) for r in rows if "loss" in r)
    assert glob.glob(os.path.join(straight, "tensorboard", "events.out.tfevents.*"))
    final = json.load(open(os.path.join(straight, "final_metrics.json")))
    assert {"heldout_ppl", "unigram_ppl", "step", "tokens_seen"} <= set(final)
    assert final["tokens_seen"] == 4 * 8 * 32


def test_gradient_accumulation_equals_the_full_batch():
    config = tiny_config()
    model = factory.build_model(config.model)
    opt = make_optimizer(config.train, model.weight_decay_mask)
    state = ts.init_train_state(model, opt, jax.random.PRNGKey(0))
    batch = jax.random.randint(jax.random.PRNGKey(1), (8, 32), 0, config.model.vocab_size)
    one, m1 = jax.jit(ts.make_train_step(model, opt, 1))(state, batch)
    acc, m2 = jax.jit(ts.make_train_step(model, opt, 2))(state, batch)
    np.testing.assert_allclose(m1["loss"], m2["loss"], rtol=1e-6)
    chex.assert_trees_all_close(one.params, acc.params, atol=1e-6)
    assert int(one.step) == int(acc.step) == 1
    with pytest.raises(ValueError, match="batch size 8 is not divisible by grad_accum 3"):
        ts.make_train_step(model, opt, 3)(state, batch)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    workdir = str(tmp_path)
    # A huge learning rate drives the weights to inf after the first steps; the loss turns NaN.
    config = tiny_config(
        steps=50, checkpoint_every=1, learning_rate=1e30, warmup_steps=0, grad_clip=1e30
    )
    with pytest.raises(TrainingError, match=r"loss is (nan|inf) at step (\d+); stopped") as err:
        train_and_evaluate(config, workdir)
    bad_step = int(str(err.value).split("at step ")[1].split(";")[0])
    with Checkpointer(workdir, cleanup_tmp=False) as ckpt:
        assert ckpt.latest_step() == bad_step - 1
    assert f"step {bad_step - 1}" in str(err.value)


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(tmp_path, caplog):
    workdir = str(tmp_path)
    train_and_evaluate(tiny_config(steps=4), workdir)
    for f in glob.glob(
        os.path.join(workdir, "checkpoints", "4", "state", "**", "d", "*"), recursive=True
    ):
        with open(f, "r+b") as fh:
            fh.truncate(8)
    final = train_and_evaluate(tiny_config(steps=6), workdir)
    assert final["step"] == 6
    assert "checkpoint step 4 unreadable" in caplog.text
