"""The GPN / GPN+M window with a hand-scheduled backward pass (`GPNConfig.scan_impl="fused"`).

Same math as `gpn_jax.core.autodiff_window.scan_window` over `gpn.step` (gradients equal to plain
autodiff within float32 rounding), arranged so the per-token loop only does what is truly
recurrent. The window is in parts, each a module of its own:

* `fused.layout`: fused projections. RMSNorm weights fold into their matrices and
  projections of one vector concatenate into one matmul, in tensor-parallel column blocks
  (`Dims.tp` > 1; that module's doc).
* `fused.stages`: the elementwise stages (the memory's write and reads, a layer's output).
* `fused.forward`: the per-token step. The write key of `s_prev` at step t is the key of `s`
  at step t-1, already a column block of W0's output: it rides in the carry.
* `fused.backward`: weight gradients out of the loop. A `jax.custom_vjp` over the window
  (`make_window`): the backward is a reverse scan that propagates cotangents of (s, key, M)
  step by step but only *emits* each projection's (input activation, output cotangent) pair;
  after each segment of S steps every weight gradient is one product with contraction S*B
  (not T products with contraction B, which is what autodiff of a scan does).
* Memory. The (B, H, K, U) memory is never stored per step: the forward keeps it every S
  steps, the backward recomputes it within a segment from the stored write inputs. With
  `remat_segment` > 0 nothing else is stored per step either: each segment's forward is rerun
  in the backward (one extra forward of the loop, memory O(T/S + S) per step-state). With
  `remat_parallel` the forward also keeps each step's memory reads but the last layer's
  ((L - 1) H U floats per token and sequence): given them no step of the rerun waits on the
  one before, so the backward reruns a segment's products once over its S * B rows
  (`fused.backward.rerun_at_once`) instead of token by token, and the memory is rebuilt by the
  recomputation alone.
* Kernels. The window is handed the resolved `model.kernels` (`core.kernel_ops.MemoryKernels`,
  never imported from a backend): where they cover the window (`dims_of`) the memory's passes
  call their `step`, `stack` and `grad`, and the loops multiply by weights
  packed once per window for their product kernel; everywhere else the XLA formulas run.
* `fused.loss`: the cross-entropy with its gradients computed in the forward pass.

The memory is stored in its carry's dtype (`GPNConfig.memory_dtype`: bfloat16 halves its
per-step traffic), each write computed in float32; the backward keeps the memory's cotangent
in float32 and passes it unchanged through the storage rounding.

Interventions (`gpn.Intervention`) are not supported here: `gpn_jax.models.gpn` refuses
them with an error naming the reference `autodiff` scan (which the ablations use).
`tests/core/test_fused_window.py` runs the window (and its block layout, on one device) against
autodiff; `tests/parallel/test_sharding.py` reads the collectives off the optimised HLO.
"""

import math
from functools import partial

import jax
import jax.numpy as jnp

from gpn_jax.core import gpn
from gpn_jax.core.fused.backward import window_bwd
from gpn_jax.core.fused.forward import window_fwd, window_primal
from gpn_jax.core.fused.layout import (
    UNROLL,
    Dims,
    along,
    check_blocks,
    col_blocks,
    fuse_params,
    head_blocks,
    key_projection,
    merge_blocks,
    shard_fused,
)
from gpn_jax.core.fused.stages import as_f32
from gpn_jax.core.gpn import GPNCarry, StepOutput
from gpn_jax.core.kernel_ops import MemoryKernels

Array = jax.Array

MIN_SEGMENT = 32  # without remat, memory checkpoints every max(MIN_SEGMENT, sqrt(T)) steps


def _make_window(dm: Dims):
    @jax.custom_vjp
    def window(fw, s0, zk0, M0, xg, keep=None):
        return window_primal(dm, fw, s0, zk0, M0, xg, keep)

    def bwd(saved, cts):
        dsT, dMT, dP, dG = cts
        if dm.memory:  # float32 cotangent whatever the memory's storage dtype
            dMT = jnp.zeros(saved[4].shape, jnp.float32) if dMT is None else as_f32(dMT)
        keep = saved[5]
        dfw, ds0, dzk0, dM0, dxg = window_bwd(dm, saved, (dsT, dMT, dP, dG))
        dM0 = None if dM0 is None else dM0.astype(saved[4].dtype)
        return dfw, ds0, dzk0, dM0, dxg, None if keep is None else jnp.zeros_like(keep)

    window.defvjp(partial(window_fwd, dm), bwd)
    return window


def default_segment(T: int) -> int:
    """Memory checkpoint interval without remat: a divisor of T near max(MIN_SEGMENT, sqrt(T)).

    Its backward recomputes S memories per segment and emits S steps of activations before
    each weight-gradient matmul (contraction S * B), so S is not taken smaller than that.
    """
    target = max(MIN_SEGMENT, math.isqrt(T))
    return max(c for c in range(1, min(T, target) + 1) if T % c == 0)


def dims_of(
    params: gpn.Params,
    T: int,
    remat_segment: int = 0,
    unroll: int | None = None,
    tp: int = 1,
    tp_axis: str | None = None,
    kernels: MemoryKernels | None = None,
    memory_dtype=jnp.float32,
    remat_parallel: bool = False,
) -> Dims:
    """The window's static sizes. `kernels` are kept where they cover the window (per device;
    the memory stored in one of their `memory_dtypes`; the products in float32)."""
    names = gpn.layer_names(params)
    lp = params[names[0]]
    mem = gpn.memory_shape(params)
    h, k, u = mem if mem else (0, 0, 0)
    f = lp["w2"].shape[0]
    if remat_segment and T % remat_segment:
        raise ValueError(
            f"sequence length {T} is not divisible by the remat segment {remat_segment}"
        )
    check_blocks(h, f, tp)
    if remat_parallel and tp > 1 and mem:
        raise ValueError(
            "remat_parallel reruns the layers from their kept memory reads, which a window "
            "split over the tensor axis reads inside its blocks; use a mesh with tensor=1 or "
            "--config.model.remat_parallel=False"
        )
    seg = min(remat_segment, T) if remat_segment else default_segment(T)
    return Dims(
        d=lp["wpg"].shape[0],
        f=f,
        h=h,
        k=k,
        u=u,
        n_layers=len(names),
        memory=mem is not None,
        segment=seg,
        remat=bool(remat_segment),
        remat_parallel=bool(remat_segment) and remat_parallel,
        unroll=UNROLL if unroll is None else unroll,
        tp=tp,
        tp_axis=tp_axis if tp > 1 else None,
        **_usable_kernels(kernels, tp, mem is not None, lp["wpg"].dtype, memory_dtype),
    )


def _usable_kernels(kernels, tp, memory, param_dtype, memory_dtype) -> dict:
    """Dims' `kernels` and `products`: what of `kernels` this window uses. The kernels run per
    device: on one device, or per shard inside a `shard_map` manual over every mesh axis of
    more than one device (`parallel.spmd` maps the batch axes so; the passes are per batch
    row). A window split over an automatic axis (tensor parallelism) keeps the XLA formulas."""
    if kernels is None or tp > 1 or not _per_device():
        return {}
    covered = memory and jnp.dtype(memory_dtype).name in kernels.memory_dtypes
    return {
        "kernels": kernels if covered else None,
        "products": kernels.matmul if param_dtype == jnp.float32 else None,
    }


def _per_device() -> bool:
    """Whether the window runs on one device's data: no mesh, or every axis of more than one
    device is manual here (inside a `shard_map` over it)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return True
    return all(size == 1 or name in mesh.manual_axes for name, size in mesh.shape.items())


def scan_window_fused(
    cp: gpn.Params,
    carry: GPNCarry,
    xg_TxBxD: Array,
    remat_segment: int = 0,
    unroll: int | None = None,
    keep_TxB: Array | None = None,
    tp: int = 1,
    tp_axis: str | None = None,
    kernels: MemoryKernels | None = None,
    remat_parallel: bool = False,
) -> tuple[GPNCarry, StepOutput]:
    """Drop-in for `autodiff_window.scan_window` (no intervention): (final carry, StepOutput (T, B, ...)).
    `keep_TxB` (0 at a document start) resets the incoming carry of those steps. `tp` column
    blocks split over mesh axis `tp_axis` (the module doc; tp == 1: one device's layout).
    `kernels`: the memory's passes and products by these (`kernel_ops`); None: XLA's.
    `remat_parallel`: with remat, rerun each segment's products at once (`Dims`)."""
    T = xg_TxBxD.shape[0]
    M_dtype = jnp.float32 if carry.M is None else carry.M.dtype
    dm = dims_of(cp, T, remat_segment, unroll, tp, tp_axis, kernels, M_dtype, remat_parallel)
    fw = shard_fused(dm, fuse_params(cp, dm.tp))
    zk0 = M0 = None
    if dm.memory:
        zk0 = along(dm, col_blocks(key_projection(cp, carry.s_prev), dm.tp), 1, batch=True)
        M0 = along(dm, head_blocks(carry.M, dm.tp), 1, batch=True)
    s0 = along(dm, carry.s, None, batch=True)
    sT, MT, P, G = _make_window(dm)(fw, s0, zk0, M0, xg_TxBxD, keep_TxB)
    if not dm.memory:
        return GPNCarry(sT, None, None), StepOutput(P, None)
    MT, G = merge_blocks(MT, dm.tp, 1), merge_blocks(G, dm.tp, 2)
    # s_prev of the final carry is the state entering the last step: re-ground it from P.
    if T > 1:
        s_last = gpn.ground(cp["ground"], P[T - 2], xg_TxBxD[T - 2])
    else:
        s_last = carry.s
    if keep_TxB is not None:  # the last step's incoming carry was reset there
        s_last = s_last * keep_TxB[T - 1][:, None]
    return GPNCarry(sT, s_last, MT), StepOutput(P, G)
