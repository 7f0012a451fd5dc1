"""Stateful training (`train.carry_state`, issue #15): the carry lives in the train state and
the checkpoint, is sharded like the batch, and a resumed run is bit-identical."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import gdn_tiny
from gpn_jax.checkpoints.manager import Checkpointer
from gpn_jax.data import pipeline
from gpn_jax.models import factory
from gpn_jax.models.base import document_starts, reset_after_eos
from gpn_jax.parallel import mesh as meshlib
from gpn_jax.training import setup
from gpn_jax.training import train_step as ts
from gpn_jax.training.loop import train_and_evaluate
from gpn_jax.training.optimizer import make_optimizer
from tests.helpers.training import tiny_bound, tiny_config
from tests.tolerance import assert_rel_close

EOS = 2


def stateful_config(**train):
    return tiny_config(carry_state=True, **train)


def final_state(workdir, config):
    model = factory.build_model(config.model)
    opt = make_optimizer(config.train, model.weight_decay_mask)
    rows = setup.carry_rows(config)
    abstract = jax.eval_shape(
        lambda r: ts.init_train_state(model, opt, r, rows), jax.random.PRNGKey(0)
    )
    with Checkpointer(workdir, async_save=False, cleanup_tmp=False) as ckpt:
        step, state, data_state, _, _ = ckpt.restore(abstract)
    return step, state, data_state


def test_carry_state_selects_the_streams_layout():
    assert pipeline.DataConfig.of(stateful_config()).train_layout == "streams"
    assert pipeline.DataConfig.of(tiny_config()).train_layout == "shuffled"


@pytest.mark.slow
def test_resumed_stateful_run_is_bit_identical_to_an_uninterrupted_one(tmp_path):
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    two = jax.devices()[:2]  # the carry split over 2 devices, as it is over any number
    train_and_evaluate(stateful_config(steps=4), straight, devices=two)
    train_and_evaluate(stateful_config(steps=2), resumed, devices=two)
    # resumes at step 2, carry included
    train_and_evaluate(stateful_config(steps=4), resumed, devices=two)
    sa, a, data_a = final_state(straight, stateful_config())
    sb, b, data_b = final_state(resumed, stateful_config())
    assert sa == sb == 4 and data_a == data_b and data_a["layout"] == "streams"
    assert jax.tree.structure(a.carry) == jax.tree.structure(b.carry)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # the carry really was carried: not the initial (zero) state after 4 steps
    assert float(jnp.abs(a.carry.s).max()) > 0


def batch(B=8, T=12, seed=0):
    x = np.random.default_rng(seed).integers(3, 64, (B, T))
    x[0, 4], x[1, T - 1], x[2, 0] = EOS, EOS, EOS  # a document inside, at the end, at the start
    return jnp.asarray(x, jnp.int32)


@pytest.mark.slow
def test_sharded_stateful_step_equals_the_plain_step_and_shards_the_carry():
    """Data-parallel over data 4 x fsdp 2 with 2 micro-batches each == one plain step (loss,
    carry, parameters), the carry of each row reset at its documents, its rows split like the
    batch's."""
    config = gdn_tiny.get_config()  # GDN: a carry with conv, delta and last-token leaves
    config.train.update(dict(batch_size=16, grad_accum=2, carry_state=True))
    config.mesh.update(dict(data=4, fsdp=2))
    run = setup.build(config, meshlib.make_mesh(config.mesh))
    state = run.init_state(jax.random.PRNGKey(0))
    for leaf in jax.tree.leaves(state.carry):
        assert leaf.sharding.spec == meshlib.batch_sharding(run.mesh).spec
    x = batch(B=16, T=config.train.seq_len)
    sharded_state, sharded_metrics = run.stateful_train_step(EOS)(state, x)

    plain = jax.jit(ts.make_train_step(run.model, run.optimizer, eos_id=EOS))
    fresh = jax.device_get(run.init_state(jax.random.PRNGKey(0)))
    plain_state, plain_metrics = plain(fresh, x)
    # sharded vs one program over 16 windows of seq_len tokens; the params after one step from
    # zero Adam moments keep the gradients' relative error
    bound = tiny_bound(x.size, config.train.seq_len)
    assert_rel_close(sharded_metrics["loss"], plain_metrics["loss"], bound, "loss")
    assert_rel_close(sharded_state.carry, plain_state.carry, bound, "carry")
    assert_rel_close(sharded_state.params, plain_state.params, bound, "params")

    loss = jax.jit(lambda p, c: run.model.loss(p, x, c, resets=document_starts(x, EOS)))
    _, (expected, _) = loss(fresh.params, fresh.carry)
    expected = reset_after_eos(run.model, expected, x, EOS)
    assert_rel_close(plain_state.carry, expected, bound, "carry of the step")  # same math
    np.testing.assert_array_equal(plain_state.carry.last_token[1], config.model.bos_id)


def test_carry_restarts_when_the_streams_start_over():
    """At a new epoch each row's next window is its stream's start: the carry is reset there
    (and only there, and not before the first step)."""
    from types import SimpleNamespace

    from gpn_jax.training import loop

    config = stateful_config()
    run = setup.build(config, meshlib.make_mesh(config.mesh))
    ones = jax.tree.map(jnp.ones_like, run.init_state(jax.random.PRNGKey(0)).carry)
    for start, step, reset in ((True, 5, True), (False, 5, False), (True, 0, False)):
        fake = SimpleNamespace(
            state=ts.TrainState(0, None, None, None, ones),
            data=SimpleNamespace(train=SimpleNamespace(at_epoch_start=start)),
            config=config,
            model=run.model,
            setup=run,
        )
        loop._reset_carry_at_epoch_start(fake, step)
        assert float(jnp.abs(fake.state.carry.s).max()) == (0.0 if reset else 1.0)
        assert fake.state.carry.M.sharding == run.state_shardings.carry.M
