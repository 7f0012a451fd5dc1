"""`build(config, mesh) -> Run`: the one recipe that turns a config into a runnable training setup.

The trainer (`training.loop`), the ahead-of-time check (`gpn_jax.aot`) and the training
benchmark (`benchmarks.train`) all build their model, optimiser, abstract train state, state
shardings and jitted steps here, so what AOT compiles and the bench times is exactly what
training runs. (Restoring parameters for evaluation needs none of this: `checkpoints.restore`
builds only the model.)

The steps are data-parallel over `data` x `fsdp` with weights gathered once per step
(`parallel.spmd.DataParallel`); on a one-device mesh that is the plain step.
"""

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from gpn_jax import kernels as kernels_lib
from gpn_jax.data.masks import loss_mask
from gpn_jax.models import factory
from gpn_jax.parallel import mesh as meshlib
from gpn_jax.parallel import sharding as shardlib
from gpn_jax.parallel.spmd import DataParallel
from gpn_jax.training import train_step as ts
from gpn_jax.training.optimizer import learning_rate_schedule, make_optimizer


@dataclasses.dataclass(frozen=True)
class Run:
    """What a config builds on a mesh (nothing is allocated: the state is abstract).

    Attributes:
      config: the ml_collections config it was built from.
      model: the `LanguageModel` (`models.factory.build_model(config.model)` unless given).
      mesh, rules: the device mesh and its logical-axis -> mesh-axis rules.
      optimizer, schedule: the optax transformation and its learning-rate schedule.
      abstract_state: `jax.eval_shape` of the initial `TrainState`.
      state_shardings: a NamedSharding per leaf of the state.
      train_step: jitted, donated `train_step(state, batch) -> (state, metrics)`.
      eval_step: jitted `eval_step(params, batch) -> (CE sum, token count)`.
      kernels: the resolved `model.kernels` ("xla", "native", "pallas"; run_info records it).
    """

    config: Any
    model: Any
    mesh: jax.sharding.Mesh
    rules: shardlib.Rules
    optimizer: optax.GradientTransformation
    schedule: optax.Schedule
    abstract_state: ts.TrainState
    state_shardings: ts.TrainState
    train_step: Any
    eval_step: Any
    kernels: str = "xla"

    def init_state(self, rng: jax.Array) -> ts.TrainState:
        """A freshly initialised train state, created in place with its shardings."""
        return self._jit_init(rng)

    def fresh_carry(self):
        """Stateful training: the initial carry of every stream, with its shardings."""
        return self._jit_fresh_carry()

    @functools.cached_property
    def _jit_fresh_carry(self):
        rows = carry_rows(self.config)
        fresh = lambda: self.model.init_state(rows)
        return jax.jit(fresh, out_shardings=self.state_shardings.carry)

    @functools.cached_property
    def _jit_init(self):
        """`init_state`'s jitted function, built once per run (a frozen dataclass may cache)."""
        rows = carry_rows(self.config)
        init = lambda r: ts.init_train_state(self.model, self.optimizer, r, rows)
        return jax.jit(init, out_shardings=self.state_shardings)

    def stateful_train_step(self, eos_id: int | None):
        """The train step of stateful training that resets the carry at the documents of
        `eos_id` (known once the data is built; `train_step` resets nowhere)."""
        t = self.config.train
        mask = loss_mask(self.config)
        return jit_train_step(
            self.model, self.optimizer, t.grad_accum, self.mesh, self.state_shardings, self.rules,
            eos_id, mask,
        )  # fmt: skip

    def state_target(self) -> ts.TrainState:
        """The abstract state carrying its shardings (a restore target, or AOT input)."""
        return jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            self.abstract_state,
            self.state_shardings,
        )

    def batch_target(self) -> jax.ShapeDtypeStruct:
        """The abstract (B, T) int32 batch, sharded over the batch axes."""
        t = self.config.train
        return jax.ShapeDtypeStruct(
            (t.batch_size, t.seq_len), jnp.int32, sharding=meshlib.batch_sharding(self.mesh)
        )


def build(config, mesh: jax.sharding.Mesh, model=None) -> Run:
    """Builds `config`'s run on `mesh` (`model` replaces the config's model if given).

    Raises:
      ValueError: the batch does not split over the mesh (or the model refuses the mesh).
    """
    t = config.train
    meshlib.check_batch(mesh, t.batch_size, t.grad_accum)
    model = factory.build_model(config.model) if model is None else model
    kernels = resolved_kernels(model)
    rules = shardlib.rules_from_config(config.mesh)
    optimizer = make_optimizer(t, model.weight_decay_mask)
    abstract = jax.eval_shape(
        lambda r: ts.init_train_state(model, optimizer, r, carry_rows(config)),
        jax.random.PRNGKey(0),
    )
    shardings = state_shardings(abstract, mesh, model, rules)
    return Run(
        config=config,
        model=model,
        mesh=mesh,
        rules=rules,
        optimizer=optimizer,
        schedule=learning_rate_schedule(t),
        abstract_state=abstract,
        state_shardings=shardings,
        # the data may restrict the training loss to some positions (recall: the answers)
        train_step=jit_train_step(
            model,
            optimizer,
            t.grad_accum,
            mesh,
            shardings,
            rules,
            loss_mask=loss_mask(config),
        ),
        eval_step=jit_eval_step(model, mesh, shardings.params, rules),
        kernels=kernels,
    )


def resolved_kernels(model) -> str:
    """`model.kernels` resolved once for the model's platform (`gpn_jax.kernels.resolve`; an
    explicit choice this machine cannot run raises here, before any compile): "xla" for the
    families without kernel choices."""
    resolve = getattr(model, "kernels", None)
    return kernels_lib.name(resolve() if callable(resolve) else None)


def carry_rows(config) -> int:
    """Streams whose carry the train state holds: one per batch row with `train.carry_state`
    (stateful training), else 0 (no carry)."""
    return config.train.batch_size if config.train.carry_state else 0


def jit_train_step(
    model, optimizer, grad_accum: int, mesh, state_sharding, rules=None, eos_id=None,
    loss_mask=None,
):  # fmt: skip
    """The jitted, donated `train_step(state, batch)` on `mesh` (what the loop and AOT compile).

    Gradient accumulation runs inside the data-parallel gradient (one reduce-scatter per
    step); `loss_mask` (T,) bool restricts the loss to those positions (None: all)."""
    return jax.jit(
        ts.make_train_step(model, optimizer, grad_accum, eos_id, mesh, rules, loss_mask),
        in_shardings=(state_sharding, meshlib.batch_sharding(mesh)),
        out_shardings=(state_sharding, meshlib.replicated(mesh)),
        donate_argnums=0,
    )


def jit_eval_step(model, mesh, param_sharding, rules=None):
    """The jitted `eval_step(params, batch) -> (CE sum, token count)` on `mesh`."""
    return jax.jit(
        ts.make_eval_step(DataParallel(model, mesh, rules)),
        in_shardings=(param_sharding, meshlib.batch_sharding(mesh)),
        out_shardings=meshlib.replicated(mesh),
    )


def state_shardings(abstract_state, mesh, model, rules=None):
    """NamedShardings of a train state (params + optimiser state) for `model` on `mesh`; a
    carry (stateful training) is sharded like the batch: its rows over the batch axes."""
    carry = getattr(abstract_state, "carry", None)
    if carry is not None:
        abstract_state = abstract_state._replace(carry=None)
    out = shardlib.tree_shardings(abstract_state, mesh, shardlib.layout_of(model), rules)
    if carry is None:
        return out
    return out._replace(carry=jax.tree.map(lambda _: meshlib.batch_sharding(mesh), carry))
