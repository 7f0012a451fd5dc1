"""A model's loss gradient and per-token losses, run data-parallel over `data` x `fsdp`.

`DataParallel(model, mesh, rules, grad_accum, loss_mask)` computes, under `jax.shard_map`
manual over the batch axes (`data`, `fsdp`) and automatic (GSPMD) over `tensor`:

* `value_and_grad(params, tokens, carry, resets) -> (loss, grads, final carry)`: what the
  train step calls, the one gradient path of training (stateless: carry None);
* `token_losses(params, tokens) -> (ce, None)`: what the eval step calls.

Inside the shard_map each device runs the unmodified model on its rows of the batch:

* fsdp-sharded parameters are all-gathered over `fsdp` once, at the top of the shard_map,
  before any `lax.scan` (the recurrence reads them T times; gathering inside the loop
  body would run T all-gathers per step);
* the loss gradient is taken *inside* the shard_map (`core.accumulate`, the one
  `jax.value_and_grad` of a train step), with respect to the gathered parameters, so the
  T-step backward scan accumulates purely local gradients; they are reduce-scattered over
  `fsdp` (`psum_scatter`) and summed over `data` once, after it. Nothing differentiates
  through the shard_map, and no per-token collective over the batch axes exists.

The tensor axis stays automatic: parameters arrive split per their declared logical axes
and `sharding.DEFAULT_RULES` (d_ffn, memory / attention heads, vocabulary), and XLA inserts the within-layer
reductions. The model is written so that these are Megatron-style: SwiGLU gate and up are
separate column-parallel matrices (`core.mlp`) and the memory read applies its norm's
per-row scale after the row-parallel `Wo` (`core.gpn.memory_read`), so a GPN layer's partial
sums are independent and XLA reduces them in one all-reduce per scan step (forward and
backward; `tests/parallel/test_sharding.py` reads it off the optimised HLO). GPN's fused
window (`scan_impl="fused"`, `core.fused.window`) gets there too: inside this shard_map runs
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

from functools import partial

import jax
import numpy as np
from jax import P

from gpn_jax.core.accumulate import accumulated_value_and_grad
from gpn_jax.parallel import sharding as shlib
from gpn_jax.parallel.mesh import BATCH_AXES

MANUAL = frozenset(BATCH_AXES)
ROWS = P(BATCH_AXES)  # batch rows (tokens, carry leaves, resets) split over the batch axes


def _manual_only(spec: P) -> P:
    """`spec` restricted to the manual (batch) axes: shard_map specs may not name `tensor`."""
    return shlib.without_axis(spec, shlib.TENSOR)


class DataParallel:
    """`model`'s loss gradient and token losses, data-parallel on `mesh` (module doc).

    The parameters' storage specs come from the model's declared logical axes through `rules`
    (None: `sharding.DEFAULT_RULES`; see `sharding.tree_specs`); only their `fsdp` entries
    matter here. The model may refuse the mesh (ValueError here), or run a layout of its own
    inside the shard_map (`model.partitioned`). `loss_mask` (T,) bool or None: the training
    loss averages the positions where it is True only (recall: the answers), handed to the
    model's `loss` as its `mask`.
    """

    def __init__(self, model, mesh, rules=None, grad_accum: int = 1, loss_mask=None):
        self.model, self.mesh, self.grad_accum = model, mesh, grad_accum
        self.rules = shlib.DEFAULT_RULES if rules is None else rules
        # What runs inside the shard_map: the model laid out for (or refusing) this split.
        local = model.partitioned(shlib.logical_splits(self.rules, dict(mesh.shape)))
        mask = None if loss_mask is None else np.asarray(loss_mask, bool)[None, :]
        self._loss_fn = local.loss if mask is None else partial(local.loss, mask=mask)
        self._token_losses = local.token_losses
        self._n_batch = mesh.shape["data"] * mesh.shape["fsdp"]
        abstract = jax.eval_shape(model.init, jax.random.PRNGKey(0))
        storage = shlib.tree_specs(abstract, mesh, shlib.layout_of(model), self.rules)
        self._boundary = jax.tree.map(_manual_only, storage, is_leaf=shlib.is_spec)
        self._dims = jax.tree.map(
            lambda s: shlib.axis_dim(s, shlib.FSDP), storage, is_leaf=shlib.is_spec
        )
        # Built once; the train step calls `grad` after `check_batch` (`value_and_grad`).
        self.grad = self._shard_map(
            self._grad_body, (self._boundary, ROWS, ROWS, ROWS), (P(), self._boundary, ROWS)
        )
        self._ce = self._shard_map(self._ce_body, (self._boundary, ROWS), ROWS)

    # ----------------------------------------------------------------- what the steps call
    def value_and_grad(self, params, tokens_BxT, carry=None, resets_BxT=None):
        """(mean CE over the global batch, its exact gradient, final carry). `carry` None: every
        window starts fresh and None is returned; else (stateful training) each row starts from
        its carry (truncated BPTT: no gradient reaches it), the final carry batch-sharded.
        `resets_BxT` (bool or None): document starts (`models.base.document_starts`)."""
        self.check_batch(tokens_BxT)
        return self.grad(params, tokens_BxT, carry, resets_BxT)

    def token_losses(self, params, tokens_BxT, carry=None):
        """Per-position CE (B, T), batch-sharded; windows start fresh, no carry returned (None)."""
        if carry is not None:
            raise NotImplementedError("DataParallel.token_losses starts every window fresh")
        self.check_batch(tokens_BxT, 1)
        return self._ce(params, tokens_BxT), None

    def check_batch(self, tokens_BxT, grad_accum: int | None = None) -> None:
        """A one-line ValueError unless the batch splits into whole micro-batch rows per device."""
        k = self.grad_accum if grad_accum is None else grad_accum
        b = tokens_BxT.shape[0]
        if b % (self._n_batch * k):
            raise ValueError(
                f"batch size {b} is not divisible by grad_accum {k} x {self._n_batch} data x "
                f"fsdp devices: it does not split into {k} micro-batch(es) per device"
            )

    # ----------------------------------------------------------------- shard_map bodies
    def _grad_body(self, params, tokens, carry, resets):
        """Per device: gather, the local loss's value and gradient over its micro-batches, reduce."""
        kw = {} if resets is None else {"resets": resets}
        full = self._gather(params)
        loss, grads, carry = accumulated_value_and_grad(
            self._loss_fn, full, tokens, carry, kw, self.grad_accum
        )
        return self._mean(loss), self._reduce(grads), carry

    def _ce_body(self, params, tokens):
        return self._token_losses(self._gather(params), tokens)[0]

    def _shard_map(self, body, in_specs, out_specs):
        """`body` manual over the batch axes; `tensor` stays automatic."""
        # check_vma=False: the models' scans start from batch-invariant zero carries that
        # become batch-varying, which the vma type check rejects. Nothing here is
        # differentiated through the shard_map (the gradient is taken inside it), so no
        # vma-dependent transpose is involved; the collectives are explicit.
        return jax.shard_map(
            body,
            mesh=self.mesh,
            in_specs=in_specs,
            out_specs=out_specs,
            axis_names=MANUAL,
            check_vma=False,
        )

    # ----------------------------------------------------------------- collectives
    def _gather(self, params):
        """All-gathers each fsdp-sharded leaf over `fsdp` (once; outside every loop)."""

        def one(p, d):
            return p if d is None else jax.lax.all_gather(p, shlib.FSDP, axis=d, tiled=True)

        return jax.tree.map(one, params, self._dims, is_leaf=lambda x: x is None)

    def _sum(self, x, axes=BATCH_AXES):
        """psum over those of `axes` with more than one device. Axes of size 1 are left out:
        on a tensor-only mesh (data = fsdp = 1) XLA's partitioner rejects an all-reduce over
        the trivial manual axes ("Cross-partition allreduce must be in (partial) manual
        partitioning mode"), and it sums nothing anyway."""
        axes = tuple(a for a in axes if self.mesh.shape[a] > 1)
        return jax.lax.psum(x, axes) if axes else x

    def _mean(self, x):
        return self._sum(x) / self._n_batch

    def _reduce(self, grads):
        """Mean over the batch shards: reduce-scatter over fsdp where stored sharded."""

        def one(g, d):
            if d is None:
                return self._mean(g)
            g = jax.lax.psum_scatter(g, shlib.FSDP, scatter_dimension=d, tiled=True)
            return self._sum(g, ("data",)) / self._n_batch

        return jax.tree.map(one, grads, self._dims, is_leaf=lambda x: x is None)
