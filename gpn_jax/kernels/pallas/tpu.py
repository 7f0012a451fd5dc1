"""The memory's three passes as Pallas kernels for the TPU (Mosaic), with the signatures and
semantics of `gpn_jax.kernels.pallas.gpu` (whose docstring holds the layout argument).

Blocks meet Mosaic's tiling rule (the last two dims of a block divisible by (8, 128) or equal
to the array's): every program owns one batch row's memories, all H heads, over a (K, bu)
column tile, so a (B, H, K) or (B, H, U) vector's block is (H, K) or (H, bu) with H whole.
bu is a multiple of 128 dividing U (default 128: a float32 (15, 128, 128) tile is 1 MiB, so
the in and out buffers Pallas double-buffers and the float32 temporaries stay well inside the
16 MiB of VMEM a kernel may use by default on v5e), or U itself. The per-(b, h) scalars beta
and eg come as (B, H, 1) arrays (a (H, 1) block broadcasts along the lanes); the resets
`keep` and the grads' step t are scalar-prefetched into SMEM, and t selects the stack's block
in the index map, so the grads read Ms[t] from HBM and nothing else of the stack.

- `step`: grid (B, U / bu), each program reads its tile once and writes M' over it
  (`input_output_aliases`).
- `stack`: grid (B, U / bu, S), the S axis sequential ('arbitrary'): the memory is carried
  through the segment in a float32 VMEM scratch (rounded to storage at every write, as stored),
  M0's block is fetched once per (b, tile) and each step's Ms block written once.
- `grad`: grid (B, U / bu), one pass over Ms[t] and dM (dM^T k and dkM are column-local);
  the row sums over U and <dM, Mi> are written per U tile and the wrapper adds the U / bu
  partials; dM_prev is written over dM's buffer.

Arithmetic is float32 on the vector units (no MXU: the reductions are over K or U of one
(b, h) memory, elementwise products and sums), so the kernels' round-off is that of the float32
formulas. `interpret=True` runs the same grid, blocks and scalar prefetch in Pallas's TPU
interpreter (`pltpu.InterpretParams`) on a CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from gpn_jax.kernels.pallas.common import F32, MEMORY_DTYPES, XLA_HINT, Config
from gpn_jax.kernels.pallas.common import col_sum as _col_sum
from gpn_jax.kernels.pallas.common import outer as _outer
from gpn_jax.kernels.pallas.common import row_sum as _row_sum

Array = jax.Array
LANES = 128


def tile_u(cfg: Config, U: int) -> int:
    """The U tile: `cfg.block_u`, else 128 where U is a multiple of it, else U."""
    bu = cfg.block_u or (LANES if U % LANES == 0 else U)
    if U % bu or (bu % LANES and bu != U):
        raise ValueError(
            f"pallas TPU memory kernels: the U tile {bu} must divide U = {U} and be a multiple "
            f"of {LANES} (or U itself); {XLA_HINT}"
        )
    return bu


def _check(M: Array, what: str = "M", ndim: int = 4) -> None:
    if M.ndim != ndim:
        raise ValueError(f"pallas TPU memory kernels: {what} has shape {M.shape}")
    if jnp.dtype(M.dtype).name not in MEMORY_DTYPES:
        raise ValueError(
            f"pallas TPU memory kernels store M in {MEMORY_DTYPES}, not "
            f"{jnp.dtype(M.dtype).name}; {XLA_HINT}"
        )


def _call(cfg: Config, kernel, grid_spec, out_shape, semantics, aliases=None):
    interpret = pltpu.InterpretParams() if cfg.interpret else False
    call = pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=out_shape,
        input_output_aliases=aliases or {},
        interpret=interpret,
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
    )
    return _fully_manual(call)


def _fully_manual(call):
    """`call` made manual over every mesh axis. Mosaic lowers a kernel only where no mesh axis
    is left to the partitioner; inside a `shard_map` manual over some axes (the batch axes of
    `gpn_jax.parallel.spmd`) the others are mapped here with replicated operands, which is
    the same computation where they have one device (the fused window hands its kernels only
    one device's shard, `core.kernel_ops`)."""

    def wrapped(*args):
        mesh = jax.sharding.get_abstract_mesh()
        if mesh.empty or not mesh.manual_axes:
            return call(*args)
        rest = frozenset(mesh.axis_names) - frozenset(mesh.manual_axes)
        if not rest:
            return call(*args)
        P = jax.sharding.PartitionSpec
        return jax.shard_map(call, in_specs=P(), out_specs=P(), axis_names=rest, check_vma=False)(
            *args
        )

    return wrapped


def _col(x: Array) -> Array:
    """(..., H) per-(b, h) scalars -> (..., H, 1), float32: a block that broadcasts along U."""
    return x.astype(F32)[..., None]


# Block specs. Index maps take the grid indices, then the scalar-prefetch refs (ignored where
# not used). Leading None dims are squeezed: the kernels see (H, K, bu), (H, K), (H, bu), (H, 1).
def _tile(H, K, bu, seq=False):  # (S?, B, H, K, U)
    if seq:
        return pl.BlockSpec((None, None, H, K, bu), lambda b, j, s, *_: (s, b, 0, 0, j))
    return pl.BlockSpec((None, H, K, bu), lambda b, j, *_: (b, 0, 0, j))


def _tile_at_t(H, K, bu):  # Ms (S, B, H, K, U) at the prefetched t
    return pl.BlockSpec((None, None, H, K, bu), lambda b, j, t_ref, *_: (t_ref[0], b, 0, 0, j))


def _vec(H, n, seq=False, tiled=False):  # (S?, B, H, n), n = K, U (tiled: bu columns) or 1
    if seq:
        return pl.BlockSpec((None, None, H, n), lambda b, j, s, *_: (s, b, 0, j if tiled else 0))
    return pl.BlockSpec((None, H, n), lambda b, j, *_: (b, 0, j if tiled else 0))


def _partial(H, n):  # (B, U / bu, H, n): one U tile's part of a row sum (n = K) or of <dM, Mi>
    return pl.BlockSpec((None, None, H, n), lambda b, j, *_: (b, j, 0, 0))


def _step_kernel(m_ref, k_ref, q_ref, v_ref, beta_ref, eg_ref, mn_ref, o_ref):
    M = m_ref[...].astype(F32)
    k = k_ref[...]
    kM = _col_sum(k, M)
    w = beta_ref[...] * (v_ref[...] - kM)
    Mn = (eg_ref[...][..., None] * M + _outer(k, w)).astype(mn_ref.dtype)
    mn_ref[...] = Mn
    o_ref[...] = _col_sum(q_ref[...], Mn.astype(F32))


def step(cfg: Config, M_BxHxKxU, k_BxHxK, q_BxHxK, v_BxHxU, beta_BxH, eg_BxH):
    """(M', o) as `memory.step`: M' written over M's buffer, o read from the stored M'."""
    _check(M_BxHxKxU)
    B, H, K, U = M_BxHxKxU.shape
    bu = tile_u(cfg, U)
    f = [x.astype(F32) for x in (k_BxHxK, q_BxHxK, v_BxHxU)]
    spec = pl.GridSpec(
        grid=(B, U // bu),
        in_specs=[_tile(H, K, bu), _vec(H, K), _vec(H, K), _vec(H, bu, tiled=True)]
        + [_vec(H, 1)] * 2,
        out_specs=[_tile(H, K, bu), _vec(H, bu, tiled=True)],
    )
    call = _call(
        cfg,
        _step_kernel,
        spec,
        [
            jax.ShapeDtypeStruct(M_BxHxKxU.shape, M_BxHxKxU.dtype),
            jax.ShapeDtypeStruct((B, H, U), F32),
        ],
        ("parallel", "parallel"),
        aliases={0: 0},
    )
    return tuple(call(M_BxHxKxU, *f, _col(beta_BxH), _col(eg_BxH)))


def _stack_kernel(
    keep_ref, m0_ref, k_ref, q_ref, v_ref, beta_ref, eg_ref, ms_ref, km_ref, qm_ref, carry_ref
):
    b, s = pl.program_id(0), pl.program_id(2)

    @pl.when(s == 0)
    def _():
        carry_ref[...] = m0_ref[...].astype(F32)

    M = carry_ref[...]  # the stored memory entering step s (a float32 copy of storage)
    ms_ref[...] = M.astype(ms_ref.dtype)
    Mi = keep_ref[s * pl.num_programs(0) + b] * M
    k = k_ref[...]
    kM = _col_sum(k, Mi)
    km_ref[...] = kM
    qm_ref[...] = _col_sum(q_ref[...], Mi)
    w = beta_ref[...] * (v_ref[...] - kM)
    Mn = eg_ref[...][..., None] * Mi + _outer(k, w)
    carry_ref[...] = Mn.astype(ms_ref.dtype).astype(F32)


def stack(cfg: Config, M0_BxHxKxU, k_SxBxHxK, q_SxBxHxK, v_SxBxHxU, beta_SxBxH, eg_SxBxH, keep_SxB):
    """(Ms, kM, qM) as `memory.stack`."""
    _check(M0_BxHxKxU)
    B, H, K, U = M0_BxHxKxU.shape
    S = k_SxBxHxK.shape[0]
    bu = tile_u(cfg, U)
    f = [x.astype(F32) for x in (k_SxBxHxK, q_SxBxHxK, v_SxBxHxU)]
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(B, U // bu, S),
        in_specs=[_tile(H, K, bu), _vec(H, K, True), _vec(H, K, True)]
        + [_vec(H, bu, True, True), _vec(H, 1, True), _vec(H, 1, True)],
        out_specs=[_tile(H, K, bu, True), _vec(H, bu, True, True), _vec(H, bu, True, True)],
        scratch_shapes=[pltpu.VMEM((H, K, bu), F32)],
    )
    call = _call(
        cfg,
        _stack_kernel,
        spec,
        [
            jax.ShapeDtypeStruct((S, B, H, K, U), M0_BxHxKxU.dtype),
            jax.ShapeDtypeStruct((S, B, H, U), F32),
            jax.ShapeDtypeStruct((S, B, H, U), F32),
        ],
        ("parallel", "parallel", "arbitrary"),
    )
    keep = keep_SxB.astype(F32).reshape(S * B)
    return tuple(call(keep, M0_BxHxKxU, *f, _col(beta_SxBxH), _col(eg_SxBxH)))


def _grad_args(Ms, t, keep_B, dM):
    _check(Ms, "Ms", 5)
    if Ms.shape[1:] != dM.shape:
        raise ValueError(
            f"pallas TPU memory grads: expected Ms (S, B, H, K, U), dM (B, H, K, U); got "
            f"{Ms.shape}, {dM.shape}"
        )
    t1 = jnp.asarray(t, jnp.int32).reshape(1)
    return t1, keep_B.astype(F32), dM.astype(F32)


def _grad_kernel(
    t_ref,
    keep_ref,
    ms_ref,
    dm_ref,
    k_ref,
    q_ref,
    w_ref,
    beta_ref,
    eg_ref,
    dkm_ref,
    dqm_ref,
    out_ref,
    dmk_ref,
    dmw_ref,
    in_ref,
    mk_ref,
    mq_ref,
):
    keep = keep_ref[pl.program_id(0)]
    M = ms_ref[...].astype(F32)
    D = dm_ref[...]
    k = k_ref[...]
    dMk = _col_sum(k, D)  # column-local: this tile's columns of dM^T k
    dmk_ref[...] = dMk
    dmw_ref[...] = _row_sum(D, w_ref[...])
    in_ref[...] = keep * jnp.sum(jnp.sum(D * M, axis=-1), axis=-1, keepdims=True)
    a = dkm_ref[...] - beta_ref[...] * dMk  # kM's whole cotangent
    c = dqm_ref[...]
    mk_ref[...] = keep * _row_sum(M, a)
    mq_ref[...] = keep * _row_sum(M, c)
    out_ref[...] = keep * (eg_ref[...][..., None] * D + _outer(k, a) + _outer(q_ref[...], c))


def grad(cfg: Config, Ms_SxBxHxKxU, t, keep_B, dM_BxHxKxU, k, q, w, beta, eg, dkM_read, dqM):
    """The backward's per-token pass as `gpu.grad`: each tile of Ms[t] and dM read once,
    dM_prev written over dM's buffer."""
    t1, keep, dM = _grad_args(Ms_SxBxHxKxU, t, keep_B, dM_BxHxKxU)
    S, B, H, K, U = Ms_SxBxHxKxU.shape
    bu = tile_u(cfg, U)
    n = U // bu
    cols = _vec(H, bu, tiled=True)
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(B, n),
        in_specs=[_tile_at_t(H, K, bu), _tile(H, K, bu), _vec(H, K), _vec(H, K), cols]
        + [_vec(H, 1), _vec(H, 1), cols, cols],
        out_specs=[_tile(H, K, bu), cols, _partial(H, K), _partial(H, 1)]
        + [_partial(H, K), _partial(H, K)],
    )
    call = _call(
        cfg,
        _grad_kernel,
        spec,
        [
            jax.ShapeDtypeStruct((B, H, K, U), F32),
            jax.ShapeDtypeStruct((B, H, U), F32),
            jax.ShapeDtypeStruct((B, n, H, K), F32),
            jax.ShapeDtypeStruct((B, n, H, 1), F32),
            jax.ShapeDtypeStruct((B, n, H, K), F32),
            jax.ShapeDtypeStruct((B, n, H, K), F32),
        ],
        ("parallel", "parallel"),
        aliases={3: 0},  # (t, keep, Ms, dM, ...): dM's buffer becomes dM_prev
    )
    vecs = [x.astype(F32) for x in (k, q, w)]
    tail = [_col(beta), _col(eg), dkM_read.astype(F32), dqM.astype(F32)]
    dM_prev, dMk, dMw, inner, mk, mq = call(t1, keep, Ms_SxBxHxKxU, dM, *vecs, *tail)
    return dM_prev, dMk, dMw.sum(axis=1), inner.sum(axis=1)[..., 0], mk.sum(axis=1), mq.sum(axis=1)
