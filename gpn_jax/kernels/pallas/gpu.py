"""The fused window's passes over the (B, H, K, U) memory as Pallas kernels: each token's write
and read (`step`), the backward's per-segment recomputation (`stack`) and the backward's
per-token pass (`grad`), with the signatures of `gpn_jax.core.kernel_ops` and the semantics of
the reference backend `gpn_jax.kernels.xla`.

Every program owns one (b, h) memory's (K, bu) column tile (grid (B, H, U / bu)). The write
and the reads are local to a column of M: with kM = M^T k, column u of
M' = eg M + k (beta (v - kM))^T and o = M'^T q needs only column u of M. So `step` reads its
tile once and writes M' over it (`input_output_aliases`), and `stack` carries its tile through
a segment's S writes in registers (a loop inside the kernel, the carried-state pattern),
writing each step's memory once. `grad` is one pass too: dM^T k and the cotangent
dkM = dkM_read - beta dM^T k are column-local, so each program reads its tiles of Ms[t] and dM
once and writes dM_prev over dM. Its row sums (dM w, Mi dkM, Mi dqM) and <dM, Mi>
span the U tiles: each program writes its tile's partial sum and the wrapper adds the U / bu
partials ((B, H, U / bu, K) vectors, small beside M).

Arithmetic is float32; M and the stack Ms are stored in M's dtype (`MEMORY_DTYPES`). A stored
memory is rounded once, where it is written, and read back from storage: `stack` carries the
rounded memory, so it recomputes exactly the memories the forward's `step` stored, and `step`'s
read o = M'^T q uses the stored M' as the reference (`gpn_jax.kernels.xla`) does.

Block sizes: on GPU (the Triton lowering) every loaded block must have a power-of-two size, so
K and bu must be powers of two; bu = 64 keeps a float32 (128, 64) tile at 32 KiB, 32 registers
per thread over 8 warps for each tile-sized value (M, Mi, M' live at once in `stack`); a whole
(128, 256) memory, 128 KiB, would spill. These defaults are not yet tuned on a GPU (`block_u`,
`num_warps`). Interpreted for the CPU, one program covers every (b, h) (the interpreter's cost
is per program: it copies each program's operands) and any K and any bu dividing U work;
`platform='cuda'` with `interpret=True` runs the GPU's grid in the interpreter instead. Under
`shard_map` the kernels need `check_vma=False` (as `gpn_jax.parallel.spmd` maps).

On a TPU, `memory_kernels(platform='tpu')` returns the Mosaic variant (`pallas.tpu`): the
same passes with blocks that meet Mosaic's tiling (all H heads of one batch row per program,
(B, H, 1) per-head scalars, the resets and the grads' step t in SMEM); these blocks do not
(the (K,) vectors and (b, h) scalars are not (8, 128)-tiled).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from gpn_jax.core.kernel_ops import MemoryKernels
from gpn_jax.kernels.pallas.common import F32, MEMORY_DTYPES, Config
from gpn_jax.kernels.pallas.common import XLA_HINT as _XLA_HINT
from gpn_jax.kernels.pallas.common import col_sum as _col_sum
from gpn_jax.kernels.pallas.common import outer as _outer
from gpn_jax.kernels.pallas.common import row_sum as _row_sum

Array = jax.Array


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _tile_u(cfg: Config, K: int, U: int) -> int:
    """The U tile for a (K, U) memory (`cfg.block_u`; else U interpreted for the CPU, else
    min(U, 64)), or a ValueError naming the XLA alternative."""
    if cfg.block_u is not None:
        bu = cfg.block_u
    elif cfg.interpret and cfg.platform == "cpu":
        bu = U  # one program: the interpreter's cost is per program
    else:
        bu = min(U, 64)
    if U % bu:
        raise ValueError(
            f"pallas memory kernels: U = {U} is not a multiple of the tile {bu}; {_XLA_HINT}"
        )
    if (
        not cfg.interpret
        and cfg.platform in ("cuda", "rocm")
        and not (_is_pow2(K) and _is_pow2(bu))
    ):
        raise ValueError(
            f"pallas memory kernels on GPU need power-of-two K and U tile (K = {K}, tile {bu}); {_XLA_HINT}"
        )
    return bu


def _check_memory(M: Array) -> None:
    if M.ndim != 4:
        raise ValueError(f"pallas memory kernels: expected M (B, H, K, U), got shape {M.shape}")
    if jnp.dtype(M.dtype).name not in MEMORY_DTYPES:
        raise ValueError(
            f"pallas memory kernels store M in {MEMORY_DTYPES}, not {jnp.dtype(M.dtype).name}; {_XLA_HINT}"
        )


def _call(cfg: Config, kernel, grid, in_specs, out_specs, out_shape, aliases=None):
    params = None
    if not cfg.interpret and cfg.platform in ("cuda", "rocm"):
        from jax.experimental.pallas import triton as plgpu

        params = plgpu.CompilerParams(num_warps=cfg.num_warps)
    return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        input_output_aliases=aliases or {},
        interpret=cfg.interpret,
        compiler_params=params,
    )


class _Blocks(NamedTuple):
    """Block specs over the grid (b, h, j), j the U tile. `bb`, `hb`: None (one batch row, one
    head per program: the GPU's grid) or B, H (every row and head in one program: the CPU's
    interpreter, whose per-program cost is copying the operands, so it runs few programs)."""

    bb: int | None
    hb: int | None
    K: int
    bu: int

    def grid(self, B, H, U):
        return (B if self.bb is None else 1, H if self.hb is None else 1, U // self.bu)

    def spec(self, tail, index_tail, lead_b=True, lead_h=True, seq=None):
        """(seq?, bb?, hb?, *tail) with index map (0?, b?, h?, *index_tail(j))."""
        block = (
            ((seq,) if seq else ())
            + ((self.bb,) if lead_b else ())
            + ((self.hb,) if lead_h else ())
        )

        def index(b, h, j):
            return (
                ((0,) if seq else ())
                + ((b,) if lead_b else ())
                + ((h,) if lead_h else ())
                + index_tail(j)
            )

        return pl.BlockSpec(block + tuple(tail), index)

    def tile(self, seq=None):  # (S?, B, H, K, U) -> (S?, bb?, hb?, K, bu)
        return self.spec((self.K, self.bu), lambda j: (0, j), seq=seq)

    def vec_k(self, seq=None):  # (S?, B, H, K)
        return self.spec((self.K,), lambda j: (0,), seq=seq)

    def vec_u(self, seq=None):  # (S?, B, H, U) -> bu columns
        return self.spec((self.bu,), lambda j: (j,), seq=seq)

    def per_bh(self, seq=None):  # (S?, B, H)
        return self.spec((), lambda j: (), seq=seq)

    def per_b(self, seq=None):  # (S?, B)
        return self.spec((), lambda j: (), lead_h=False, seq=seq)

    def partial_k(self):  # (B, H, U / bu, K): one U tile's part of a row sum
        return self.spec((None, self.K), lambda j: (j, 0))

    def partial(self):  # (B, H, U / bu)
        return self.spec((None,), lambda j: (j,))


def _blocks(cfg: Config, B: int, H: int, K: int, U: int) -> _Blocks:
    whole = cfg.interpret and cfg.platform == "cpu"
    return _Blocks(B if whole else None, H if whole else None, K, _tile_u(cfg, K, U))


def _bc(x, ndim: int):
    """x (per (b, h) or per b, or a scalar) with trailing unit dims to broadcast against an
    array of `ndim` dims whose leading dims are x's."""
    return x if x.ndim == 0 else x.reshape(x.shape + (1,) * (ndim - x.ndim))


def _step_kernel(m_ref, k_ref, q_ref, v_ref, beta_ref, eg_ref, mn_ref, o_ref):
    M = m_ref[...].astype(F32)
    k = k_ref[...]
    kM = _col_sum(k, M)
    w = _bc(beta_ref[...], kM.ndim) * (v_ref[...] - kM)
    Mn = (_bc(eg_ref[...], M.ndim) * M + _outer(k, w)).astype(mn_ref.dtype)
    mn_ref[...] = Mn
    o_ref[...] = _col_sum(q_ref[...], Mn.astype(F32))


def step(cfg: Config, M_BxHxKxU, k_BxHxK, q_BxHxK, v_BxHxU, beta_BxH, eg_BxH):
    """(M', o): M' = eg M + k (beta (v - M^T k))^T in M's dtype, written over M's buffer, and
    o = M'^T q (float32, from the stored M')."""
    _check_memory(M_BxHxKxU)
    B, H, K, U = M_BxHxKxU.shape
    bl = _blocks(cfg, B, H, K, U)
    vecs = [x.astype(F32) for x in (k_BxHxK, q_BxHxK, v_BxHxU, beta_BxH, eg_BxH)]
    call = _call(
        cfg,
        _step_kernel,
        bl.grid(B, H, U),
        [bl.tile(), bl.vec_k(), bl.vec_k(), bl.vec_u(), bl.per_bh(), bl.per_bh()],
        [bl.tile(), bl.vec_u()],
        [
            jax.ShapeDtypeStruct(M_BxHxKxU.shape, M_BxHxKxU.dtype),
            jax.ShapeDtypeStruct((B, H, U), F32),
        ],
        aliases={0: 0},
    )
    return tuple(call(M_BxHxKxU, *vecs))


def _stack_kernel(m0_ref, k_ref, q_ref, v_ref, beta_ref, eg_ref, keep_ref, ms_ref, km_ref, qm_ref):
    S = k_ref.shape[0]
    dtype = ms_ref.dtype

    def body(t, M):  # M: the stored memory entering step t (float32 copy of storage)
        ms_ref[t] = M.astype(dtype)
        Mi = _bc(keep_ref[t], M.ndim) * M
        k = k_ref[t]
        kM = _col_sum(k, Mi)
        km_ref[t] = kM
        qm_ref[t] = _col_sum(q_ref[t], Mi)
        w = _bc(beta_ref[t], kM.ndim) * (v_ref[t] - kM)
        return (_bc(eg_ref[t], M.ndim) * Mi + _outer(k, w)).astype(dtype).astype(F32)

    jax.lax.fori_loop(0, S, body, m0_ref[...].astype(F32))


def stack(cfg: Config, M0_BxHxKxU, k_SxBxHxK, q_SxBxHxK, v_SxBxHxU, beta_SxBxH, eg_SxBxH, keep_SxB):
    """(Ms (S, B, H, K, U) in M0's dtype, kM, qM (S, B, H, U) float32): Ms[t] the memory entering
    step t (before its reset), M <- eg Mi + k (beta (v - Mi^T k))^T with Mi = keep M; kM = Mi^T k
    and qM = Mi^T q of each step."""
    _check_memory(M0_BxHxKxU)
    B, H, K, U = M0_BxHxKxU.shape
    S = k_SxBxHxK.shape[0]
    bl = _blocks(cfg, B, H, K, U)
    vecs = [
        x.astype(F32) for x in (k_SxBxHxK, q_SxBxHxK, v_SxBxHxU, beta_SxBxH, eg_SxBxH, keep_SxB)
    ]
    seq_k, seq_u, seq_bh = bl.vec_k(S), bl.vec_u(S), bl.per_bh(S)
    call = _call(
        cfg,
        _stack_kernel,
        bl.grid(B, H, U),
        [bl.tile(), seq_k, seq_k, seq_u, seq_bh, seq_bh, bl.per_b(S)],
        [bl.tile(S), seq_u, seq_u],
        [
            jax.ShapeDtypeStruct((S, B, H, K, U), M0_BxHxKxU.dtype),
            jax.ShapeDtypeStruct((S, B, H, U), F32),
            jax.ShapeDtypeStruct((S, B, H, U), F32),
        ],
    )
    return tuple(call(M0_BxHxKxU, *vecs))


def _grad_args(cfg: Config, Ms, t, keep_B, dM):
    """(Ms, t (1,), keep, dM) for the grad kernels. Interpreted for the CPU, Ms[t] is sliced
    first: the interpreter copies each program's whole (S, K, bu) block, where a compiled kernel
    (or the interpreter standing in for one, platform 'cuda') loads one step of it."""
    if Ms.ndim != 5 or Ms.shape[1:] != dM.shape:
        raise ValueError(
            f"pallas memory grads: expected Ms (S, B, H, K, U), dM (B, H, K, U); got {Ms.shape}, {dM.shape}"
        )
    if jnp.dtype(Ms.dtype).name not in MEMORY_DTYPES:
        raise ValueError(f"pallas memory grads: Ms in {Ms.dtype} unsupported; {_XLA_HINT}")
    t1 = jnp.asarray(t, jnp.int32).reshape(1)
    if cfg.interpret and cfg.platform == "cpu":
        Ms, t1 = jax.lax.dynamic_slice_in_dim(Ms, t1[0], 1), jnp.zeros(1, jnp.int32)
    return Ms, t1, keep_B.astype(F32), dM.astype(F32)


def _scalar_t():
    return pl.BlockSpec((1,), lambda b, h, j: (0,))


def _grad_kernel(
    ms_ref,
    t_ref,
    keep_ref,
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
    keep = keep_ref[...]
    M = ms_ref[t_ref[0]].astype(F32)
    D = dm_ref[...]
    k = k_ref[...]
    dMk = _col_sum(k, D)  # column-local: this tile's columns of dM^T k
    dmk_ref[...] = dMk
    dmw_ref[...] = _row_sum(D, w_ref[...])
    # one axis at a time: jax 0.11's Triton lowering of a two-axis sum keeps a stale sharding
    # under an abstract mesh (lowering for a GPU from a host without one)
    inner = jnp.sum(jnp.sum(D * M, axis=-1), axis=-1)
    in_ref[...] = _bc(keep, inner.ndim) * inner
    a = dkm_ref[...] - _bc(beta_ref[...], dMk.ndim) * dMk  # kM's whole cotangent
    c = dqm_ref[...]
    Ma, Mc = _row_sum(M, a), _row_sum(M, c)
    mk_ref[...] = _bc(keep, Ma.ndim) * Ma
    mq_ref[...] = _bc(keep, Mc.ndim) * Mc
    D = _bc(eg_ref[...], D.ndim) * D + _outer(k, a) + _outer(q_ref[...], c)
    out_ref[...] = _bc(keep, D.ndim) * D


def grad(cfg: Config, Ms, t, keep_B, dM, k, q, w, beta, eg, dkM_read, dqM):
    """The backward's per-token pass (`gpn_jax.core.kernel_ops`): (dM_prev, dM^T k, dM w,
    <dM, Mi>, Mi dkM, Mi dqM) float32 with Mi = keep Ms[t], dkM = dkM_read - beta dM^T k; each tile
    of Ms[t] and dM read once, dM_prev written over dM's buffer."""
    Ms, t1, keep, dM = _grad_args(cfg, Ms, t, keep_B, dM)
    S, B, H, K, U = Ms.shape
    bl = _blocks(cfg, B, H, K, U)
    n = U // bl.bu
    vecs = [x.astype(F32) for x in (k, q, w, beta, eg, dkM_read, dqM)]
    call = _call(
        cfg,
        _grad_kernel,
        bl.grid(B, H, U),
        [bl.tile(S), _scalar_t(), bl.per_b(), bl.tile(), bl.vec_k(), bl.vec_k(), bl.vec_u()]
        + [bl.per_bh(), bl.per_bh(), bl.vec_u(), bl.vec_u()],
        [bl.tile(), bl.vec_u(), bl.partial_k(), bl.partial(), bl.partial_k(), bl.partial_k()],
        [
            jax.ShapeDtypeStruct((B, H, K, U), F32),
            jax.ShapeDtypeStruct((B, H, U), F32),
            jax.ShapeDtypeStruct((B, H, n, K), F32),
            jax.ShapeDtypeStruct((B, H, n), F32),
            jax.ShapeDtypeStruct((B, H, n, K), F32),
            jax.ShapeDtypeStruct((B, H, n, K), F32),
        ],
        aliases={3: 0},
    )
    dM_prev, dMk, dMw, inner, mk, mq = call(Ms, t1, keep, dM, *vecs)
    return dM_prev, dMk, dMw.sum(axis=2), inner.sum(axis=2), mk.sum(axis=2), mq.sum(axis=2)


def memory_kernels(
    interpret: bool | None = None,
    platform: str | None = None,
    block_u: int | None = None,
    num_warps: int = 8,
) -> MemoryKernels:
    """The passes built for `platform` (None: JAX's default backend, 'gpu' read as 'cuda'):
    Triton kernels for 'cuda' / 'rocm', Mosaic kernels (`pallas.tpu`) for 'tpu'. `interpret`
    None: Pallas's interpreter exactly when that platform is the CPU; with 'tpu' and
    interpret=True, the TPU variant runs in Pallas's TPU interpreter. `block_u` (the U tile)
    and `num_warps` (Triton) are tuning knobs for a GPU or TPU run to sweep."""
    platform = platform or jax.default_backend()
    platform = {"gpu": "cuda"}.get(platform, platform)
    if interpret is None:
        interpret = platform == "cpu"
    if not interpret and platform not in ("cuda", "rocm", "tpu"):
        raise ValueError(
            f"pallas memory kernels compile for GPU or TPU, not {platform!r}; run them with interpret=True or {_XLA_HINT}"
        )
    cfg = Config(bool(interpret), platform, block_u, num_warps)
    passes = (step, stack, grad)
    if platform == "tpu":  # the Mosaic variant (interpreted: Pallas's TPU interpreter)
        from gpn_jax.kernels.pallas import tpu

        passes = (tpu.step, tpu.stack, tpu.grad)
    return MemoryKernels("pallas", *(functools.partial(f, cfg) for f in passes), MEMORY_DTYPES)
