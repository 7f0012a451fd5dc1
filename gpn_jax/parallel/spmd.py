"""The model, run data-parallel over `data` x `fsdp` with weights gathered once per step.

`ShardedModel(model, mesh, rules)` offers the model's `loss` and `token_losses` (what the
train and eval steps call) computed under `jax.shard_map`, manual over the batch axes
(`data`, `fsdp`) and automatic (GSPMD) over `tensor`:

* each device runs the unmodified model on its rows of the batch;
* fsdp-sharded parameters are all-gathered over `fsdp` once, at the top of the shard_map,
  before any `lax.scan` (the recurrence reads them T times; gathering inside the loop
  body would run T all-gathers per step);
* the loss gradient is taken *inside* the shard_map, with respect to the gathered
  parameters, so the T-step backward scan accumulates purely local gradients; they are
  reduce-scattered over `fsdp` (`psum_scatter`) and summed over `data` once, after it.

The gradient is supplied through `jax.custom_vjp`: the forward pass of `value_and_grad`
computes local loss and gradient together (one forward + backward, as `value_and_grad`
would), the backward pass only scales the reduced gradient by the cotangent. So
`jax.value_and_grad(lambda p, x: sharded.loss(p, x)[0])` - the unmodified train step - gets
the exact full-batch gradient, and no per-token collective over the batch axes exists.

The tensor axis stays automatic: parameters arrive split per their declared logical axes
and `sharding.DEFAULT_RULES` (d_ffn, memory / attention heads, vocabulary), and XLA inserts the within-layer
reductions. The model is written so that these are Megatron-style: SwiGLU gate and up are
separate column-parallel matrices (`core.mlp`) and the memory read applies its norm's
per-row scale after the row-parallel `Wo` (`core.gpn.memory_read`), so a GPN layer's partial
sums are independent and XLA reduces them in one all-reduce per scan step (forward and
backward; `tests/parallel/test_sharding.py` reads it off the optimised HLO). GPN's fused
window (`scan_impl="fused"`, `core.fused_window`) gets there too: inside this shard_map runs
`model.partitioned(...)`, the model laid out for the mesh's split of its logical axes (GPN:
fused matrices in per-device column blocks of whole heads and d_ffn slices). Known cost: with
`tensor` > 1, XLA all-gathers each tensor-split gradient over `tensor` before the `fsdp`
reduce-scatter (partial-manual partitioning): once per step, outside every loop.

With `grad_accum` = k > 1 each device splits its rows into k micro-batches and scans them
inside the shard_map, accumulating local gradients, so weights are still gathered once and
gradients reduce-scattered once per training step (not once per micro-batch). Micro-batches
are equal in size, so the mean of their means is the full-batch loss and gradient. The price
is one gathered (unsharded) float32 gradient accumulator per device, 4 bytes per parameter;
`gpn_jax.aot` shows it in the per-device plan.
"""

import jax
from jax import P

from gpn_jax.core.accumulate import accumulated_value_and_grad, accumulated_value_grad_and_aux
from gpn_jax.parallel import sharding as shlib
from gpn_jax.parallel.mesh import BATCH_AXES

MANUAL = frozenset(BATCH_AXES)


def _manual_only(spec: P) -> P:
    """`spec` restricted to the manual (batch) axes: shard_map specs may not name `tensor`."""
    return shlib.without_axis(spec, shlib.TENSOR)


class ShardedModel:
    """Wraps a `LanguageModel` so that `loss` / `token_losses` run data-parallel on `mesh`.

    Every other attribute is the wrapped model's. The parameters' storage specs come from the
    model's declared logical axes through `rules` (None: `sharding.DEFAULT_RULES`; see
    `sharding.tree_specs`); only their `fsdp` entries matter here. The model may refuse the
    mesh, or run a layout of its own inside the shard_map (`model.partitioned`). The
    gradient of `loss` accumulates over `grad_accum` local micro-batches (see the module doc).
    """

    def __init__(self, model, mesh, rules=None, grad_accum: int = 1):
        self.model, self.mesh = model, mesh
        self.rules = shlib.DEFAULT_RULES if rules is None else rules
        # What runs inside the shard_map: the model laid out for (or refusing) this split.
        self._local = model.partitioned(shlib.logical_splits(self.rules, dict(mesh.shape)))
        self.grad_accum = grad_accum
        self.layout = shlib.layout_of(model)
        self._n_batch = mesh.shape["data"] * mesh.shape["fsdp"]
        self._loss = self._make_loss()

    def __getattr__(self, name):
        return getattr(self.model, name)

    # ----------------------------------------------------------------- pieces
    def _specs(self, params):
        """(specs at the shard_map boundary, the fsdp-sharded dimension of each leaf or None)."""
        storage = shlib.tree_specs(params, self.mesh, self.layout, self.rules)
        boundary = jax.tree.map(_manual_only, storage, is_leaf=shlib.is_spec)
        dims = jax.tree.map(lambda s: shlib.axis_dim(s, shlib.FSDP), storage, is_leaf=shlib.is_spec)
        return boundary, dims

    def _gather(self, params, dims):
        """All-gathers each fsdp-sharded leaf over `fsdp` (once; outside every loop)."""

        def one(p, d):
            return p if d is None else jax.lax.all_gather(p, shlib.FSDP, axis=d, tiled=True)

        return jax.tree.map(one, params, dims, is_leaf=lambda x: x is None)

    def _sum(self, x, axes=BATCH_AXES):
        """psum over those of `axes` with more than one device. Axes of size 1 are left out:
        on a tensor-only mesh (data = fsdp = 1) XLA's partitioner rejects an all-reduce over
        the trivial manual axes ("Cross-partition allreduce must be in (partial) manual
        partitioning mode"), and it sums nothing anyway."""
        axes = tuple(a for a in axes if self.mesh.shape[a] > 1)
        return jax.lax.psum(x, axes) if axes else x

    def _mean(self, x):
        return self._sum(x) / self._n_batch

    def _reduce(self, grads, dims):
        """Mean over the batch shards: reduce-scatter over fsdp where stored sharded."""

        def one(g, d):
            if d is None:
                return self._mean(g)
            g = jax.lax.psum_scatter(g, shlib.FSDP, scatter_dimension=d, tiled=True)
            return self._sum(g, ("data",)) / self._n_batch

        return jax.tree.map(one, grads, dims, is_leaf=lambda x: x is None)

    def _check_batch(self, tokens, grad_accum: int = 1):
        if tokens.shape[0] % (self._n_batch * grad_accum):
            raise ValueError(
                f"batch of {tokens.shape[0]} rows does not split into {grad_accum} "
                f"micro-batch(es) over data x fsdp = {self._n_batch} devices"
            )

    def _local_loss(self, params, tokens):
        return self._local.loss(params, tokens)[0]

    def _shard_map(self, body, boundary, out_specs, in_specs=None):
        """`body(params, tokens)` manual over the batch axes; `tensor` stays automatic."""
        # check_vma=False: the models' scans start from batch-invariant zero carries that
        # become batch-varying, which the vma type check rejects. Nothing here is
        # differentiated through the shard_map (the gradient is taken inside it), so no
        # vma-dependent transpose is involved; the collectives are explicit.
        return jax.shard_map(
            body,
            mesh=self.mesh,
            in_specs=(boundary, P(BATCH_AXES)) if in_specs is None else in_specs,
            out_specs=out_specs,
            axis_names=MANUAL,
            check_vma=False,
        )

    # ----------------------------------------------------------------- loss with custom gradient
    def _make_loss(self):
        def mapped(params, tokens, with_grad: bool):
            boundary, dims = self._specs(params)

            def body(p, x):
                full = self._gather(p, dims)
                if not with_grad:
                    return self._mean(self._local_loss(full, x))
                # Local gradient, accumulated over this device's micro-batches, reduced once.
                loss, grads = accumulated_value_and_grad(self._local_loss, full, x, self.grad_accum)
                return self._mean(loss), self._reduce(grads, dims)

            out_specs = P() if not with_grad else (P(), boundary)
            return self._shard_map(body, boundary, out_specs)(params, tokens)

        @jax.custom_vjp
        def loss(params, tokens):
            return mapped(params, tokens, with_grad=False)

        def fwd(params, tokens):
            value, grads = mapped(params, tokens, with_grad=True)
            return value, grads

        def bwd(grads, ct):
            return jax.tree.map(lambda g: (g * ct).astype(g.dtype), grads), None

        loss.defvjp(fwd, bwd)
        return loss

    def loss(self, params, tokens_BxT, carry=None):
        """Mean CE over the global batch. Returns (loss, (None, {'loss': loss})).

        Differentiable in `params` (exact full-batch gradient); windows start fresh (carry=None).
        """
        if carry is not None:
            raise NotImplementedError("ShardedModel.loss starts every window fresh (carry=None)")
        self._check_batch(tokens_BxT, self.grad_accum)
        value = self._loss(params, tokens_BxT)
        return value, (None, {"loss": value})

    def stateful_value_and_grad(self, params, tokens_BxT, carry, resets_BxT=None):
        """(loss, grads, final carry) of stateful training (`training.train_step`): each device
        runs its rows from their carry (rows of every carry leaf and of `resets` split like
        the batch), gradients reduced as `loss`'s, the final carry left batch-sharded."""
        self._check_batch(tokens_BxT, self.grad_accum)
        boundary, dims = self._specs(params)
        rows = lambda tree: jax.tree.map(lambda _: P(BATCH_AXES), tree)

        def local(p, micro):
            tokens, c, r = micro
            loss, (new, _) = self._local.loss(p, tokens, c, resets=r)
            return loss, new

        def body(p, x, c, r):
            full = self._gather(p, dims)
            loss, grads, new = accumulated_value_grad_and_aux(
                local, full, (x, c, r), self.grad_accum
            )
            return self._mean(loss), self._reduce(grads, dims), new

        in_specs = (boundary, P(BATCH_AXES), rows(carry), rows(resets_BxT))
        mapped = self._shard_map(body, boundary, (P(), boundary, rows(carry)), in_specs)
        return mapped(params, tokens_BxT, carry, resets_BxT)

    def token_losses(self, params, tokens_BxT, carry=None):
        """Per-position CE (B, T), batch-sharded; the carry is not returned (None)."""
        if carry is not None:
            raise NotImplementedError("ShardedModel.token_losses starts every window fresh")
        self._check_batch(tokens_BxT)
        boundary, dims = self._specs(params)

        def body(p, x):
            return self._local.token_losses(self._gather(p, dims), x)[0]

        return self._shard_map(body, boundary, P(BATCH_AXES))(params, tokens_BxT), None
