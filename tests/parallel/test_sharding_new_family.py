"""A model family defined here, not in gpn_jax, shards through `gpn_jax.parallel` unchanged:
its parameters' logical axes (one of them, `hidden`, unknown to parallel/) are all the
sharding code needs; a config's `mesh.axis_rules` maps the new axis to a mesh axis."""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax import P

from gpn_jax.core import loss as loss_lib
from gpn_jax.models import params as params_lib
from gpn_jax.models.params import EMBED, VOCAB, lecun, ones, param, small
from gpn_jax.parallel import mesh as meshlib
from gpn_jax.parallel import sharding as shardlib
from gpn_jax.parallel import spmd
from gpn_jax.training import setup
from gpn_jax.training import train_step as ts
from gpn_jax.training.optimizer import make_optimizer
from tests.tolerance import assert_rel_close, f32_bound, rel_err

V, D, H, B, T = 32, 8, 16, 8, 8


class BigramMLP:
    """Toy family: each token predicts the next through one tanh layer (no state)."""

    config = None

    def specs(self) -> dict:
        return {
            "embed": param(small, (V, D), (VOCAB, EMBED)),
            "norm": param(ones, (D,)),
            "w_in": param(lecun, (D, H), (EMBED, "hidden")),
            "w_out": param(lecun, (H, D), ("hidden", EMBED)),
        }

    def init(self, rng):
        return params_lib.init_params(self.specs(), rng)

    def param_axes(self):
        return params_lib.flat_axes(self.specs())

    def axis_sizes(self):
        return {"hidden": H, "vocab": V}

    def partitioned(self, splits):
        return self

    def weight_decay_mask(self, params):
        return jax.tree.map(lambda p: p.ndim >= 2, params)

    def _ce(self, params, tokens_BxT, per_token: bool):
        x = params["embed"][tokens_BxT[:, :-1]] * params["norm"]
        h = jnp.tanh(x @ params["w_in"]) @ params["w_out"]
        logits_fn = lambda h: h @ params["embed"].T
        ce = loss_lib.per_token_cross_entropy if per_token else loss_lib.cross_entropy_sum
        return ce(logits_fn, jnp.swapaxes(h, 0, 1), tokens_BxT[:, 1:].T, chunk=4)

    def loss(self, params, tokens_BxT, carry=None):
        loss = self._ce(params, tokens_BxT, False) / (tokens_BxT.shape[0] * (T - 1))
        return loss, (carry, {"loss": loss})

    def token_losses(self, params, tokens_BxT, carry=None):
        return self._ce(params, tokens_BxT, True).T, carry


def make_mesh(shape):
    return meshlib.make_mesh(ml_collections.ConfigDict(dict(zip(meshlib.AXES, shape, strict=True))))


RULES = shardlib.rules_from_config(ml_collections.ConfigDict({"axis_rules": {"hidden": "tensor"}}))


def test_declared_axes_shard_params_and_optimiser_state():
    model = BigramMLP()
    train = dict(grad_clip=1.0, learning_rate=1e-2, warmup_steps=0, steps=10, min_lr_ratio=0.1,
                 b1=0.9, b2=0.95, weight_decay=0.1)  # fmt: skip
    opt = make_optimizer(ml_collections.ConfigDict(train), model.weight_decay_mask)
    abstract = jax.eval_shape(lambda r: ts.init_train_state(model, opt, r), jax.random.PRNGKey(0))
    mesh = make_mesh((2, 2, 2))
    spec = lambda rules: jax.tree.map(
        lambda s: s.spec, setup.state_shardings(abstract, mesh, model, rules)
    )
    p = spec(RULES).params
    assert p == {
        "embed": P("tensor", "fsdp"),
        "norm": P(),
        "w_in": P("fsdp", "tensor"),
        "w_out": P("tensor", "fsdp"),
    }
    assert spec(RULES).opt_state[1][0].mu == p  # Adam moments follow their parameters
    # without a rule for `hidden` that dimension stays whole
    assert spec(None).params["w_in"] == P("fsdp")


@functools.cache
def _problem():
    model = BigramMLP()
    params = model.init(jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (B, T), 0, V)
    ref = jax.jit(jax.value_and_grad(lambda p: model.loss(p, tokens)[0]))(params)
    return model, params, tokens, jax.device_get(ref)


def test_sharded_loss_and_grads_match_one_device():
    model, params, tokens, (ref_loss, ref_grads) = _problem()
    mesh = make_mesh((2, 2, 2))
    shardings = shardlib.tree_shardings(params, mesh, shardlib.layout_of(model), RULES)
    assert shardings["w_in"].spec == P("fsdp", "tensor")
    sharded = spmd.DataParallel(model, mesh, RULES)
    batch = meshlib.batch_sharding(mesh)
    with jax.set_mesh(mesh):
        loss, grads = jax.jit(
            lambda p, x: sharded.value_and_grad(p, x)[:2],
            in_shardings=(shardings, batch),
            out_shardings=(meshlib.replicated(mesh), shardings),
        )(jax.device_put(params, shardings), jax.device_put(tokens, batch))
    # float32 sums in another order (sharded partial sums): the longest reductions are the mean
    # over the B*T tokens after the V-way logsumexp and the H-wide layer; x8 for the chain
    bound = f32_bound(B * T + V + H, 8)
    assert rel_err(loss, ref_loss) <= bound
    assert_rel_close(grads, ref_grads, bound, "sharded gradients")
    assert max(float(np.abs(g).max()) for g in jax.tree.leaves(ref_grads)) > 1e-3
