"""One recipe builds a run (`training.setup.build`); restore reads parameters only; data from config."""

import chex
import jax
import numpy as np
import pytest
from ml_collections import ConfigDict

from experiments.configs import gpn_m_tiny
from gpn_jax.checkpoints import restore
from gpn_jax.checkpoints.manager import Checkpointer
from gpn_jax.data import pipeline
from gpn_jax.parallel import mesh as meshlib
from gpn_jax.training import optimizer as optimizer_lib
from gpn_jax.training import setup
from gpn_jax.training import train_step as ts
from tests.helpers.training import norm_bound, tiny_bound

RECALL = "recall:pairs=4,keys=8,values=6,examples=64,heldout=16,seed=3"


def tiny_config(batch_size=8):
    c = gpn_m_tiny.get_config()
    c.train.update(batch_size=batch_size, grad_accum=1)
    return c


def one_device_mesh():
    return meshlib.make_mesh(ConfigDict({"data": 1, "fsdp": 1, "tensor": 1}), jax.devices()[:1])


@pytest.fixture(scope="module")
def one_device_run():
    """`tiny_config()` built on a one-device mesh, shared (its compiled initialiser too)."""
    config = tiny_config()
    return config, setup.build(config, one_device_mesh())


def test_the_built_step_on_one_device_is_the_plain_step(one_device_run):
    """What the bench times (`build` on a one-device mesh) is the unsharded train step."""
    config, run = one_device_run
    tokens = jax.random.randint(jax.random.PRNGKey(1), (8, config.train.seq_len), 0, 512)
    plain = jax.jit(ts.make_train_step(run.model, run.optimizer))
    state = run.init_state(jax.random.PRNGKey(0))
    want_state, want = plain(state, tokens)
    with jax.set_mesh(run.mesh):
        got_state, got = run.train_step(state, tokens)
    # Same math, another program (the jit with shardings): 8 windows of seq_len tokens
    n_tokens = tokens.size
    n_params = sum(np.size(x) for x in jax.tree.leaves(want_state.params))
    rtol = tiny_bound(n_tokens, config.train.seq_len)
    np.testing.assert_allclose(float(got["loss"]), float(want["loss"]), rtol=rtol)
    rtol = norm_bound(n_tokens, n_params, config.train.seq_len)
    np.testing.assert_allclose(float(got["grad_norm"]), float(want["grad_norm"]), rtol=rtol)
    assert int(got_state.step) == int(want_state.step) == 1


def test_build_refuses_a_batch_that_does_not_split_over_the_mesh():
    mesh = meshlib.make_mesh(ConfigDict({"data": 8, "fsdp": 1, "tensor": 1}), jax.devices()[:8])
    with pytest.raises(ValueError, match="does not split into 1 micro-batch"):
        setup.build(tiny_config(batch_size=4), mesh)


def test_load_run_reads_the_parameters_without_building_an_optimizer(
    tmp_path, monkeypatch, one_device_run
):
    config, run = one_device_run
    state = jax.device_get(run.init_state(jax.random.PRNGKey(3)))
    with Checkpointer(str(tmp_path), async_save=False) as ckpt:
        ckpt.save(5, state, {}, config.to_dict(), {"step": 5})

    def no_optimizer(*args, **kwargs):
        raise AssertionError("restore built an optimiser")

    monkeypatch.setattr(optimizer_lib, "make_optimizer", no_optimizer)
    loaded = restore.load_run(str(tmp_path))
    assert loaded.step == 5
    chex.assert_trees_all_equal(jax.device_get(loaded.params), state.params)
    # The partial restore is orbax's: the optimiser state is not in what comes back.
    with Checkpointer(str(tmp_path), keep=None, read_only=True) as ckpt:
        _, params, *_ = ckpt.restore(jax.eval_shape(lambda: state.params), 5, params_only=True)
    chex.assert_trees_all_equal(jax.device_get(params), state.params)


def test_data_from_config_is_the_data_build_data_gives():
    config = tiny_config()
    config.data.source = RECALL
    config.model.vocab_size = 20
    config.train.seq_len = 19
    got = pipeline.from_config(config)
    want = pipeline.build_data(
        RECALL, vocab_size=20, seq_len=19, batch_size=8, heldout_fraction=config.data.heldout_fraction,
        seed=config.seed, bin_dtype=config.data.bin_dtype,
    )  # fmt: skip
    np.testing.assert_array_equal(next(got.train), next(want.train))
    np.testing.assert_array_equal(np.asarray(got.heldout), np.asarray(want.heldout))
    assert pipeline.DataConfig.of(config).train_layout == "shuffled"
