"""Checkpoints across topologies: written on mesh (2, 4, 1), restored on (8, 1, 1) and on one
device with the target shardings, and training continues with the same loss."""

import json
import os

import chex
import jax
import ml_collections
import numpy as np
import pytest

from experiments.configs import gpn_m_tiny
from gpn_jax.checkpoints.manager import Checkpointer
from gpn_jax.models import factory
from gpn_jax.parallel import mesh as meshlib
from gpn_jax.parallel import sharding as shardlib
from gpn_jax.training import train_step as ts
from gpn_jax.training.loop import train_and_evaluate
from gpn_jax.training.optimizer import make_optimizer
from tests.helpers.training import norm_bound, tiny_bound


def tiny_config():
    c = gpn_m_tiny.get_config()
    c.train.update(dict(batch_size=8, seq_len=8, warmup_steps=0, steps=10))
    c.model.loss_chunk = 8
    return c


def make_mesh(shape, devices=None):
    return meshlib.make_mesh(
        ml_collections.ConfigDict(dict(zip(meshlib.AXES, shape, strict=True))), devices
    )


class Setup:
    def __init__(self, config):
        self.model = factory.build_model(config.model)
        self.opt = make_optimizer(config.train, self.model.weight_decay_mask)
        self.init = lambda r: ts.init_train_state(self.model, self.opt, r)
        self.abstract = jax.eval_shape(self.init, jax.random.PRNGKey(0))
        self.layout = shardlib.layout_of(self.model)

    def on_mesh(self, mesh):
        """(state shardings, jitted train step) for `mesh`, as the training loop builds them."""
        state_sh = shardlib.tree_shardings(self.abstract, mesh, self.layout)
        step = ts.make_train_step(self.model, self.opt, mesh=mesh)
        jitted = jax.jit(
            step,
            in_shardings=(state_sh, meshlib.batch_sharding(mesh)),
            out_shardings=(state_sh, meshlib.replicated(mesh)),
            donate_argnums=0,
        )
        return state_sh, jitted


def target(abstract, shardings):
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
    )


def test_checkpoint_written_on_2x4x1_restores_on_8x1x1_and_one_device(tmp_path):
    config = tiny_config()
    s = Setup(config)
    rng = np.random.RandomState(0)
    batches = [rng.randint(0, config.model.vocab_size, (8, 8)).astype(np.int32) for _ in range(3)]

    mesh_a = make_mesh((2, 4, 1))
    sh_a, step_a = s.on_mesh(mesh_a)
    with jax.set_mesh(mesh_a):
        state = jax.jit(s.init, out_shardings=sh_a)(jax.random.PRNGKey(0))
        for b in batches[:2]:
            state, _ = step_a(state, meshlib.put_batch(b, mesh_a))
        assert state.params["layer_0"]["w1"].sharding.spec == jax.P("fsdp")
        saved = jax.device_get(state)
        with Checkpointer(tmp_path, async_save=False) as ckpt:
            assert ckpt.save(2, state, {"pos": 2}, config.to_dict(), {})
        state, metrics = step_a(state, meshlib.put_batch(batches[2], mesh_a))
        expected = {k: float(metrics[k]) for k in ("loss", "grad_norm")}

    mesh_b = make_mesh((8, 1, 1))
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    for name, mesh in (("8x1x1", mesh_b), ("one device", None)):
        if mesh is None:
            shardings = jax.tree.map(lambda _: one, s.abstract)
            step = jax.jit(ts.make_train_step(s.model, s.opt), donate_argnums=0)
            put = lambda b: jax.device_put(b, one)
        else:
            shardings, step = s.on_mesh(mesh)
            put = lambda b, mesh=mesh: meshlib.put_batch(b, mesh)
        with Checkpointer(tmp_path, async_save=False, cleanup_tmp=False) as ckpt:
            got_step, restored, data_state, _, _ = ckpt.restore(target(s.abstract, shardings))
        assert got_step == 2 and data_state == {"pos": 2}
        restored = ts.TrainState(*restored)
        assert jax.tree.map(lambda x: x.sharding, restored) == shardings, name
        chex.assert_trees_all_equal(jax.device_get(restored), saved)  # bit-exact restore
        state, metrics = step(restored, put(batches[2]))
        # The step on the new layout, compared before the optimiser (Adam turns float-order
        # noise in a near-zero gradient entry into a full-size update; the restored state is
        # bit-exact above): batches of 8 x 8 tokens in another sharding
        n_params = sum(np.size(x) for x in jax.tree.leaves(saved.params))
        rel = {"loss": tiny_bound(64, positions=8), "grad_norm": norm_bound(64, n_params, 8)}
        for k, want in expected.items():
            assert float(metrics[k]) == pytest.approx(want, rel=rel[k]), (name, k)


@pytest.mark.slow
def test_training_resumes_on_another_mesh(tmp_path):
    """train_and_evaluate on (2, 2, 1), stopped at step 2, resumed on (4, 1, 1): the
    losses of steps 3-4 match an uninterrupted (2, 2, 1) run. Four devices are enough for the
    restore to turn fsdp-sharded parameters into replicated ones and to split the batch anew."""

    def config(steps, mesh):
        c = tiny_config()
        c.train.update(dict(steps=steps, checkpoint_every=2, eval_every=0, log_every=1))
        c.train.warmup_steps = 10  # the LR schedule then does not depend on `steps`
        c.train.final_eval_batches = 1
        c.mesh.data, c.mesh.fsdp, c.mesh.tensor = mesh
        return c

    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    four = jax.devices()[:4]
    train_and_evaluate(config(4, (2, 2, 1)), straight, devices=four)
    train_and_evaluate(config(2, (2, 2, 1)), resumed, devices=four)
    train_and_evaluate(config(4, (4, 1, 1)), resumed, devices=four)
    rows = lambda w: {
        r["step"]: r["loss"]
        for r in map(json.loads, open(os.path.join(w, "metrics.jsonl")))
        if "loss" in r
    }
    a, b = rows(straight), rows(resumed)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    # another mesh's reduction order at each step since the restore (bit-exact): 2 steps of
    # batches of 8 x 8 tokens
    bound = 2 * tiny_bound(64, positions=8)
    np.testing.assert_allclose([b[k] for k in (3, 4)], [a[k] for k in (3, 4)], rtol=bound)
