"""The GPN / GPN+M window with a hand-scheduled backward pass (`GPNConfig.scan_impl="fused"`).

Same math as `gpn_jax.core.window.scan_window` over `gpn.step` (gradients equal to plain
autodiff within float32 rounding), arranged so the per-token loop only does what is truly
recurrent:

* **Fused projections.** Every projection of a vector through an RMSNorm weight is
  `rms(x) @ (diag(w) W)`, so the norm weights fold into their matrices (outside the loop,
  by ordinary differentiable JAX ops) and projections of the same vector concatenate into
  one matmul: per token one `rms(s) @ W0` serves the write (key, value, beta, decay) and
  predict layer 0 (ffn, gate, query, read gate); one `[h | r] @ [W2; diag(out_norm) Wo]`
  gives ffn + read; one `rms(c) @ Wl` per further layer; one `rms(p) @ diag(g) Wgate`.
* **The write key is computed once.** The key of `s_prev` at step t is the key of `s` at
  step t-1, which is already a column block of W0's output: it rides in the carry.
* **Weight gradients out of the loop.** A `jax.custom_vjp` over the window: the backward
  is a reverse scan that propagates cotangents of (s, key, M) step by step but only
  *emits* each projection's (input activation, output cotangent) pair; after each segment
  of S steps every weight gradient is one `einsum('sbi,sbo->io')` with contraction S*B
  (not T products with contraction B, which is what autodiff of a scan does).
* **Memory.** The (B, H, K, U) memory is never stored per step: the forward keeps it
  every S steps, the backward recomputes it within a segment from the stored write
  inputs (cheap: elementwise plus two (K x U) contractions per head). With
  `remat_segment` > 0 nothing else is stored per step either: each segment's forward is
  rerun in the backward (one extra forward of the loop, memory O(T/S + S) per step-state).
* **Per-token products on CPU.** On one CPU device in float32 (by default where the CPU has
  AVX-512, or AVX2 and FMA: `gpn_jax.native.small_matmul`), the loops' fused matrices are
  packed once per window (`_loop_weights`) and multiplied by a compiled kernel instead of
  XLA's dots. A float32 memory is then also written and read (`_write_read`) and recomputed for
  the backward by compiled kernels, and with one predict layer and no remat the backward's
  per-token passes over it are two kernel calls (`gpn_jax.native.memory`; `_memory_bwd` has
  the formulas).

* **Tensor parallelism** (`Dims.tp` > 1, the size of the mesh axis that splits memory heads
  and d_ffn, which `GPN.partitioned` takes from the sharding rules and the mesh). Megatron style with GSPMD
  partitioning, as the autodiff scan: each fused matrix is laid out "tp-major" so that the
  `tensor` split lines up with the parameters' shards. Every column block split over
  `tensor` (the write's key / value / beta / decay and the read's query / gate columns, per
  head; SwiGLU's gate and up) is reshaped from (D, n) to (D, tp, n / tp) and the blocks
  concatenated along the last axis: W0 is (D, tp, N0 / tp), axis 1 split over `tensor`
  (`_along`); the row-parallel W2o is (tp, R / tp, D) and the memory (B, tp, H / tp, K, U).
  Elementwise stages then act on each device's (B, tp, n / tp) block, and splitting the last
  axis never crosses devices. Columns that `tensor` does not split (the predict gate wpg,
  D x D; the ground gate) are replicated projections of their own, computed on every device.
  The read norm's sum of squares spans all heads, so its per-row scale multiplies the
  row-parallel product, y = h @ W2 + scale * (r @ Wo) (as `core.gpn.memory_read`): the
  layer's partial sums h @ W2, r @ Wo and sum(o^2) are independent and XLA reduces them in
  one all-reduce per layer and step. The backward saves (r @ Wo, scale), both replicated, so
  the scale's derivative is local (`_layer_split_bwd`) and its one all-reduce per layer is
  the input cotangent dZ @ W^T of the column-parallel projection (contracted over the
  blocks); weight gradients stay local. tp must divide n_heads and d_ffn (else an error).
  With tp == 1 there is no block axis: the predict gate stays in W0 and the read scale is
  applied before W2o, the one-device program of before. `tests/parallel/test_sharding.py`
  reads the collectives off the optimised HLO; `tests/core/test_fast_window.py` runs the
  block layout on one device against autodiff.

The memory is stored in its carry's dtype (`GPNConfig.memory_dtype`: bfloat16 halves its
per-step traffic), each write computed in float32; the backward keeps the memory's cotangent
in float32 and passes it unchanged through the storage rounding.

Interventions (`gpn.Intervention`) are not supported here: `gpn_jax.models.gpn` refuses
them with an error naming the reference `autodiff` scan (which the ablations use).

Measured (`python -m gpn_jax.bench --config=experiments/configs/bench_small.py`, GPN+M 1L
d=512, B=16, T=512, float32, 2-core AMD EPYC, matmul peak measured in the run 213 GFLOP/s):
training step 4.66 s -> 2.96 s, MFU 30.7 % -> 48.3 %, peak RSS 3.57 -> 1.20 GiB (autodiff ->
fused). `UNROLL` 1, 2 and 4 measured the same on CPU; 1 compiles fastest.
"""

import dataclasses
import math
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from gpn_jax.core import gpn, loss
from gpn_jax.core.gpn import GPNCarry, StepOutput
from gpn_jax.core.kernel_ops import MemoryKernels, ProductKernel
from gpn_jax.core.norms import RMS_EPS, l2n, mm, rms

Array = jax.Array

UNROLL = 1  # lax.scan unroll of the per-token loops (measured: see gpn_jax/benchmarks)
MIN_SEGMENT = 32  # without remat, memory checkpoints every max(MIN_SEGMENT, sqrt(T)) steps


@dataclasses.dataclass(frozen=True)
class Dims:
    """Static sizes of the fused step (hashable: closes over the custom_vjp).

    `hk`, `hu`, `hb`, `fb`, `write_cols` and `layer_cols` are per column block (tensor shard):
    the whole model when tp == 1."""

    d: int
    f: int
    h: int
    k: int
    u: int
    n_layers: int
    memory: bool
    segment: int  # steps per segment (memory checkpoint / remat / weight-gradient interval)
    remat: bool  # True: rerun each segment's forward in the backward (store only boundaries)
    unroll: int = UNROLL
    tp: int = 1  # column blocks of the fused matrices (the tensor axis size; module doc)
    tp_axis: str | None = None  # the mesh axis the blocks are split over; None: unconstrained
    kernels: MemoryKernels | None = None  # the memory's passes by these kernels (`kernel_ops`)
    products: ProductKernel | None = None  # loops multiply by packed weights (`_loop_weights`)

    @property
    def split(self) -> bool:
        """tp > 1: blocks on an axis of their own, the predict gate its own replicated
        projection, the read norm's scale applied after Wo (see the module doc)."""
        return self.tp > 1

    @property
    def hb(self) -> int:
        return self.h // self.tp

    @property
    def fb(self) -> int:
        return self.f // self.tp

    @property
    def hk(self) -> int:
        return self.hb * self.k

    @property
    def hu(self) -> int:
        return self.hb * self.u

    @property
    def write_cols(self) -> int:
        return self.hk + self.hu + 2 * self.hb if self.memory else 0

    def layer_cols(self) -> list[int]:
        """Column widths of a predict layer's fused input projection [w1 | w3 | wpg | wq | wrg]
        (per block; without wpg when `split`)."""
        cols = [self.fb, self.fb] + ([] if self.split else [self.d])
        return cols + ([self.hk, self.hu] if self.memory else [])


# ----------------------------------------------------------------------------- tp-major blocks
def _blocks(x: Array, tp: int) -> Array:
    """(..., n) -> (..., tp, n / tp): the column blocks a `tensor` split of n gives each device
    (contiguous, as `NamedSharding` splits a parameter); unchanged when tp == 1."""
    return x if tp == 1 else x.reshape(*x.shape[:-1], tp, x.shape[-1] // tp)


def _row_blocks(w: Array, tp: int) -> Array:
    """(n, D) -> (tp, n / tp, D): a row-parallel matrix's blocks; unchanged when tp == 1."""
    return w if tp == 1 else w.reshape(tp, w.shape[0] // tp, w.shape[1])


def _head_blocks(M: Array, tp: int) -> Array:
    """(B, H, K, U) -> (B, tp, H / tp, K, U); unchanged when tp == 1."""
    return M if tp == 1 else M.reshape(M.shape[0], tp, M.shape[1] // tp, *M.shape[2:])


def _merge_blocks(x: Array, tp: int, axis: int) -> Array:
    """Inverse of the block reshapes: merges `axis` (the blocks) with the next one."""
    if tp == 1:
        return x
    return x.reshape(*x.shape[:axis], x.shape[axis] * x.shape[axis + 1], *x.shape[axis + 2 :])


# The dimension of each fused weight that holds its blocks (the others are replicated).
_BLOCK_DIM = {"W0": 1, "b0": 0, "Wl": 1, "bl": 0, "W2o": 0, "a": 0}


def _along(dm: Dims, x: Array | None, dim: int | None, batch: bool = False):
    """`x` split over `dm.tp_axis` at `dim`, replicated elsewhere (a leading batch dimension
    left to the partitioner); unchanged without a tensor axis."""
    if x is None or dm.tp_axis is None:
        return x
    spec = [None] * x.ndim
    if batch:
        spec[0] = PartitionSpec.UNCONSTRAINED
    if dim is not None:
        spec[dim] = dm.tp_axis
    return jax.lax.with_sharding_constraint(x, PartitionSpec(*spec))


def _shard_fused(dm: Dims, fw: dict) -> dict:
    return {
        name: jax.tree.map(lambda x, d=_BLOCK_DIM.get(name): _along(dm, x, d), v)
        for name, v in fw.items()
    }


# ----------------------------------------------------------------------------- fused weights
def fuse_params(cp: gpn.Params, tp: int = 1) -> dict:
    """Folds RMSNorm weights into their matrices and concatenates projections of one vector,
    in `tp` column blocks (module doc; tp == 1: one block, no block axis).

    Differentiable: gradients of the fused weights flow back to the original parameters.
    """
    names = gpn.layer_names(cp)
    mem = gpn.has_memory(cp)
    f32 = jnp.float32

    def fold(norm, w):
        return (norm[:, None] * w.astype(f32)).astype(w.dtype)

    def zeros(w):
        return jnp.zeros((w.shape[1],), f32)

    def concat(pairs):
        """[(matrix (D, n), bias (n,))] -> blocks concatenated: (D, [tp,] N), ([tp,] N)."""
        mats = [_blocks(m, tp) for m, _ in pairs]
        biases = [_blocks(b.astype(f32), tp) for _, b in pairs]
        return jnp.concatenate(mats, axis=-1), jnp.concatenate(biases, axis=-1)

    def layer_proj(lp):
        """A layer's input projections [w1, w3, (wpg), wq, wrg] and, when tp > 1, wpg apart:
        its D columns are not split over `tensor`, so every device computes them."""
        pairs = [(fold(lp["ffn_norm"], lp[n]), zeros(lp[n])) for n in ("w1", "w3")]
        gate = (fold(lp["pg_norm"], lp["wpg"]), lp["bpg"])
        read = []
        if mem:
            wrg = fold(lp["read_norm"], lp["wrg"])
            read = [(fold(lp["read_norm"], lp["wq"]), lp["bq"]), (wrg, zeros(wrg))]
        if tp == 1:
            return pairs + [gate] + read, None
        return pairs + read, gate

    write = []
    if mem:
        wp = cp["write"]
        write = [(fold(wp["norm"], wp["wk"]), wp["bk"])]
        write += [(fold(wp["norm"], wp[n]), zeros(wp[n])) for n in ("wv", "wbeta")]
        write += [(fold(wp["norm"], wp["wa"]), wp["dt_bias"])]
    fw = {"Wl": [], "bl": [], "W2o": [], "Wpg": [], "bpg": []}
    for i, name in enumerate(names):
        lp = cp[name]
        pairs, gate = layer_proj(lp)
        W, b = concat(write + pairs if i == 0 else pairs)
        if i == 0:
            fw["W0"], fw["b0"] = W, b
        else:
            fw["Wl"].append(W)
            fw["bl"].append(b)
        if gate is not None:
            fw["Wpg"].append(gate[0])
            fw["bpg"].append(gate[1].astype(f32))
        out = [lp["w2"]]
        if mem:
            out.append(fold(lp["out_norm"], lp["wo"]))
        fw["W2o"].append(jnp.concatenate([_row_blocks(w, tp) for w in out], axis=-2))
    fw["Wg"] = fold(cp["ground"]["gate_norm"], cp["ground"]["gate_w"])
    fw["bg"] = cp["ground"]["gate_b"].astype(f32)
    fw["a"] = _blocks(jnp.exp(cp["write"]["A_log"]), tp) if mem else jnp.zeros((0,), f32)
    return fw


def key_projection(cp: gpn.Params, s: Array) -> Array:
    """The write key pre-activation of `s` (bias included): W0's first column block."""
    wp = cp["write"]
    return mm(rms(s) * wp["norm"], wp["wk"]) + wp["bk"]


# ----------------------------------------------------------------------------- elementwise stages
def _heads(x: Array, h: int) -> Array:
    return x.reshape(*x.shape[:-1], h, x.shape[-1] // h)


def _split(x: Array, widths: list[int]) -> list[Array]:
    return jnp.split(x, list(_cumsum(widths[:-1])), axis=-1)


def _cumsum(xs):
    t = 0
    for x in xs:
        t += x
        yield t


def _rowwise(v_B: Array, x: Array) -> Array:
    """A per-row (B,) factor shaped to broadcast against `x` (B, ...), in x's dtype."""
    return v_B.reshape(-1, *([1] * (x.ndim - 1))).astype(x.dtype)


def _write_inputs(dm: Dims, zk_prev, zw, a):
    """The write's key (l2-normalised), value, beta and log-decay g per head, from the previous
    key pre-activation and this step's [v | beta | a] columns."""
    return _key(dm, zk_prev), *_write_gates(dm, zw, a)


def _key(dm: Dims, zk):
    return l2n(jax.nn.relu(_heads(zk, dm.hb)))


def _write_gates(dm: Dims, zw, a):
    """(v, beta, g) per head from the step's [v | beta | a] columns."""
    zv, zb, za = _split(zw, [dm.hu, dm.hb, dm.hb])
    return _heads(zv, dm.hb), jax.nn.sigmoid(zb), -a * jax.nn.softplus(za)


def _write(dm: Dims, zk_prev, zw, a, M):
    """Gated delta write from the previous key pre-activation and this step's [v | beta | a] columns
    (per block of heads: every head's write is local to it).

    Computed in float32, returned in M's dtype (`memory_dtype` storage)."""
    M_in, M = M, M.astype(jnp.float32)
    k, v, beta, g = _write_inputs(dm, zk_prev, zw, a)
    k_M = jnp.einsum("...hk,...hku->...hu", k, M)
    delta = jnp.einsum("...hk,...hu->...hku", k, beta[..., None] * (v - k_M))
    return (jnp.exp(g)[..., None, None] * M + delta).astype(M_in.dtype), g


def _write_read(dm: Dims, zk_prev, zw, a, zq, M):
    """`_write` and layer 0's `_read_out` by the kernels' `step`: (M', g, o)."""
    k, v, beta, g = _write_inputs(dm, zk_prev, zw, a)
    Mn, o = dm.kernels.step(M, k, _query(dm, zq), v, beta, jnp.exp(g))
    return Mn, g, o.reshape(*o.shape[:-2], dm.hu)


def _query(dm: Dims, zq):
    """The read's query per head (l2-normalised), (B, [tp,] hb, k)."""
    return l2n(jax.nn.relu(_heads(zq, dm.hb)))


def _read_out(dm: Dims, zq, Mn):
    """Each head's memory read o, (B, [tp,] hu) per block."""
    q = _query(dm, zq)
    o = jnp.einsum("...hk,...hku->...hu", q, Mn.astype(jnp.float32))
    return o.reshape(*q.shape[:-2], dm.hu)


def _layer_pre(dm: Dims, Z, Mn):
    """tp == 1. From a layer's fused projection: X2 = [silu(gate) * up | silu(zrg) * rms(q . M')]
    and pg."""
    o = _read_out(dm, _split(Z, dm.layer_cols())[3], Mn) if dm.memory else None
    return _layer_out(dm, Z, o)


def _layer_out(dm: Dims, Z, o):
    """tp == 1. `_layer_pre` given the layer's memory read o (B, hu) (None without memory)."""
    gate, up, zpg, *read = _split(Z, dm.layer_cols())
    h = jax.nn.silu(gate) * up
    pg = jax.nn.sigmoid(zpg)
    if o is None:
        return h, pg
    return jnp.concatenate([h, jax.nn.silu(read[1]) * rms(o)], axis=-1), pg


def _layer_local(dm: Dims, Z, Mn):
    """tp > 1. From a layer's column blocks: (h, r, o) with r = silu(zrg) * o not yet scaled
    by the read norm (whose sum of squares spans every block); all local to a block."""
    gate, up, *read = _split(Z, dm.layer_cols())
    h = jax.nn.silu(gate) * up
    if not dm.memory:
        return h, None, None
    zq, zrg = read
    o = _read_out(dm, zq, Mn)
    return h, jax.nn.silu(zrg) * o, o


def _layer_split(dm: Dims, fw: dict, i: int, Z, Mn):
    """tp > 1. A layer's ffn + read output (B, D) and, with memory, (r @ Wo, scale) for the
    backward. As `core.gpn.memory_read`, the read norm's per-row scale rsqrt(mean(o^2) + eps)
    multiplies the row-parallel product, so the three partial sums (h @ W2, r @ Wo, sum o^2)
    are independent: XLA reduces them in the layer's one all-reduce."""
    h, r, o = _layer_local(dm, Z, Mn)
    y = _rows(h, fw["W2"][i])
    if not dm.memory:
        return y, None
    ss = jnp.sum(o * o, axis=(-2, -1))[:, None]  # (B, 1) over every block's heads
    scale = jax.lax.rsqrt(ss / (dm.h * dm.u) + RMS_EPS)
    y_r = _rows(r, fw["Wo"][i])
    return y + scale * y_r, (y_r, scale)


@dataclasses.dataclass(frozen=True)
class Packed:
    """A weight matrix packed once per window for a product kernel (`ProductKernel`)."""

    operand: object  # the kernel's packed operand (a pytree)
    matmul: object  # (x, operand) -> x @ W float32

    def __call__(self, x: Array) -> Array:
        return self.matmul(x, self.operand)


jax.tree_util.register_dataclass(Packed, data_fields=["operand"], meta_fields=["matmul"])


def _cols(x: Array, w: Array | Packed) -> Array:
    """x (B, D) @ w (D, ...) in w's dtype, float32 out: (B, ...)."""
    if isinstance(w, Packed):
        return w(x)
    return jax.lax.dot_general(
        x.astype(w.dtype), w, (((x.ndim - 1,), (0,)), ((), ())), preferred_element_type=jnp.float32
    )


def _rows(x: Array, w: Array | Packed) -> Array:
    """x (B, ...) contracted with w (..., D) over all of w's leading axes, float32 out: (B, D).
    With blocks split over `tensor` the contraction spans them: a partial sum per device."""
    if isinstance(w, Packed):
        return w(x)
    n = w.ndim - 1
    dims = (tuple(range(x.ndim - n, x.ndim)), tuple(range(n)))
    return jax.lax.dot_general(
        x.astype(w.dtype), w, (dims, ((), ())), preferred_element_type=jnp.float32
    )


def _mm_t(dz: Array, w: Array) -> Array:
    """dz @ w.T in w's dtype, float32 out (the input cotangent of `mm(x, w)`)."""
    return jax.lax.dot_general(
        dz.astype(w.dtype),
        w,
        (((dz.ndim - 1,), (1,)), ((), ())),
        preferred_element_type=jnp.float32,
    )


def _transposed(fw: dict) -> dict:
    """The matrices the backward loop multiplies cotangents by, transposed once outside the loop
    (XLA:CPU runs a (B, N) @ (N, D) product much faster than (B, N) contracted with (D, N)).
    Column blocks (D, [tp,] N) -> ([tp,] N, D); row blocks ([tp,] R, D) -> (D, [tp,] R)."""
    return {
        "W0": jnp.moveaxis(fw["W0"], 0, -1),
        "Wl": [jnp.moveaxis(w, 0, -1) for w in fw["Wl"]],
        "W2o": [jnp.moveaxis(w, -1, 0) for w in fw["W2o"]],
        "Wg": fw["Wg"].T,
        "Wpg": [w.T for w in fw["Wpg"]],
    }


def _with_halves(dm: Dims, fw: dict) -> dict:
    """tp > 1: W2o's [W2; Wo] halves for the forward's two row-parallel products, sliced
    once outside the loop (along each block's rows: no data moves between devices)."""
    if not dm.split:
        return fw
    return fw | {
        "W2": [w[:, : dm.fb] for w in fw["W2o"]],
        "Wo": [w[:, dm.fb :] for w in fw["W2o"]],
    }


def _loop_weights(dm: Dims, fw: dict) -> dict:
    """The matrices a per-token loop multiplies by (`fw`'s or `_transposed(fw)`'s), packed once
    outside the loop for the product kernel `dm.products` (one device, float32)."""
    if dm.products is None:
        return fw
    pack = lambda w: Packed(dm.products.pack(w), dm.products.matmul)
    single = {k: pack(fw[k]) for k in ("W0", "Wg")}
    per_layer = {k: [pack(w) for w in fw[k]] for k in ("Wl", "W2o")}
    return fw | single | per_layer


def _wgrad(x_SxBxI: Array, dz_SxBxO: Array, w: Array) -> Array:
    """sum over (s, b) of x^T dz: one matmul with contraction S*B, float32. Blocks ride along:
    (S, B, [tp,] I) x (S, B, [tp,] O) -> ([tp,] I, [tp,] O), nothing contracted over them.

    Contracted as (I, S*B) @ (S*B, O): an einsum over (s, b) lowers to a dot contracting
    (b, s), for which XLA transposes both operands (a copy of each). The small x^T is
    materialised on CPU (an optimisation barrier keeps XLA from folding the transpose back into
    the dot): XLA:CPU ran the dot contracting both operands' first axis half as fast for the
    loss's (256 x 512) @ (512 x 8192) embedding gradient (25.1 against 12.8 ms; W0's per
    segment: no clear difference; `python experiments/loop_costs.py`)."""
    n = x_SxBxI.shape[0] * x_SxBxI.shape[1]
    x_t = x_SxBxI.reshape(n, -1).astype(w.dtype).T
    if jax.default_backend() == "cpu":  # accelerators' dots take transposed operands as they are
        x_t = jax.lax.optimization_barrier(x_t)
    out = jnp.matmul(
        x_t, dz_SxBxO.reshape(n, -1).astype(w.dtype), preferred_element_type=jnp.float32
    )
    return out.reshape(*x_SxBxI.shape[2:], *dz_SxBxO.shape[2:])


def _bias_grad(dz_SxBxO: Array) -> Array:
    """sum over (s, b) of dz as a (1, S*B) @ (S*B, O) product (XLA:CPU reduces over the
    leading axes several times slower than it multiplies by ones)."""
    n = dz_SxBxO.shape[0] * dz_SxBxO.shape[1]
    dz = dz_SxBxO.reshape(n, -1)
    return (jnp.ones((n,), dz.dtype) @ dz).reshape(dz_SxBxO.shape[2:])


# ----------------------------------------------------------------------------- forward
class Res(NamedTuple):
    """Per-step residuals of the forward (everything but the memory)."""

    s: Array  # (B, D) grounded state entering the step
    zk: Array | None  # (B, [tp,] HK) key pre-activation of s_prev (the write key of this step)
    Z0: Array  # (B, [tp,] N0) fused projection of rms(s)
    c: list  # per layer l >= 1: (B, D) the layer's input
    Z: list  # per layer l >= 1: (B, [tp,] Nl) its fused projection
    p: Array  # (B, D)
    zg: Array  # (B, D) ground gate pre-activation
    zpg: list  # tp > 1, per layer: (B, D) predict-gate pre-activation (its own projection)
    read: list  # tp > 1 with memory, per layer: (r @ Wo (B, D), read norm scale (B, 1))


def _step(dm: Dims, fw: dict, carry, xg: Array):
    """One token. carry = (s, zk, M); returns (carry', (p, g), Res)."""
    s, zk, M = carry
    x = rms(s)
    Z0 = _cols(x, fw["W0"]) + fw["b0"]
    Mn, g, zk_new, o0 = None, None, None, None
    Zl = Z0
    if dm.memory:
        zk_new, zw, Zl = _split(Z0, [dm.hk, dm.hu + 2 * dm.hb, Z0.shape[-1] - dm.write_cols])
        if _kernel_memory(dm, M):  # the write and layer 0's read in one call
            Mn, g, o0 = _write_read(dm, zk, zw, fw["a"], _split(Zl, dm.layer_cols())[3], M)
        else:
            Mn, g = _write(dm, zk, zw, fw["a"], M)
    c, cs, Zs, zpgs, reads = s, [], [], [], []
    for i in range(dm.n_layers):
        if i:
            x = rms(c)
            Zl = _cols(x, fw["Wl"][i - 1]) + fw["bl"][i - 1]
            cs.append(c)
            Zs.append(Zl)
        if dm.split:
            zpg = mm(x, fw["Wpg"][i]) + fw["bpg"][i]
            y, read = _layer_split(dm, fw, i, Zl, Mn)
            c = jax.nn.sigmoid(zpg) * c + y
            zpgs.append(zpg)
            if read is not None:
                reads.append(read)
        else:
            X2, pg = _layer_pre(dm, Zl, Mn) if i or o0 is None else _layer_out(dm, Zl, o0)
            c = pg * c + _rows(X2, fw["W2o"][i])
    zg = _cols(rms(c), fw["Wg"]) + fw["bg"]
    s_new = jax.nn.sigmoid(zg) * c + xg
    return (s_new, zk_new, Mn), (c, g), Res(s, zk, Z0, cs, Zs, c, zg, zpgs, reads)


def _reset(dm: Dims, fw: dict, carry, keep_B):
    """The incoming carry, reset to the initial state where `keep_B` is 0 (a document start):
    s = 0, M = 0, and the key pre-activation of s_prev = 0, which is W0's key bias."""
    if keep_B is None:
        return carry
    s, zk, M = carry
    if dm.memory:
        k = _rowwise(keep_B, zk)
        zk = zk * k + (1 - k) * fw["b0"][..., : dm.hk]
        M = M * _rowwise(keep_B, M)  # 0 / 1: exact in any storage dtype
    return s * keep_B[:, None], zk, M


def _scan_steps(dm: Dims, fw, carry, xg_SxBxD, keep: str, keep_SxB=None):
    """Steps over a run of tokens. keep: 'out' -> (p, g); 'res' -> (p, g, Res); 'resM' -> + M
    before each step (before its reset). `keep_SxB`: per-step resets (`_reset`) or None."""

    def body(c, x):
        xg, kp = x if keep_SxB is not None else (x, None)
        new, out, res = _step(dm, fw, _reset(dm, fw, c, kp), xg)
        if keep == "out":
            return new, out
        if keep == "res":
            return new, (out, res)
        return new, (out, res, c[2])

    xs = xg_SxBxD if keep_SxB is None else (xg_SxBxD, keep_SxB)
    return jax.lax.scan(body, carry, xs, unroll=dm.unroll)


def _segments(x: Array | None, S: int) -> Array | None:
    return None if x is None else x.reshape(x.shape[0] // S, S, *x.shape[1:])


def _unsegment(x: Array) -> Array:
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _window_primal(dm: Dims, fw, s0, zk0, M0, xg, keep=None):
    fw = _loop_weights(dm, _with_halves(dm, fw))
    (sT, _, MT), (P, G) = _scan_steps(dm, fw, (s0, zk0, M0), xg, "out", keep)
    return sT, MT, P, G


def _window_fwd(dm: Dims, fw, s0, zk0, M0, xg, keep=None):
    S = dm.segment
    fwh = _loop_weights(dm, _with_halves(dm, fw))

    def seg(carry, xs):
        xg_seg, keep_seg = xs
        if dm.remat:
            new, (out) = _scan_steps(dm, fwh, carry, xg_seg, "out", keep_seg)
            return new, (carry, out, None)
        new, (out, res) = _scan_steps(dm, fwh, carry, xg_seg, "res", keep_seg)
        return new, (carry, out, res)

    xs = (_segments(xg, S), _segments(keep, S))
    (sT, zkT, MT), (starts, (P, G), res) = jax.lax.scan(seg, (s0, zk0, M0), xs)
    P, G = _unsegment(P), None if G is None else _unsegment(G)
    return (sT, MT, P, G), (fw, xg, starts, res, MT, keep)


# ----------------------------------------------------------------------------- backward
def _layer_split_bwd(dm: Dims, fwT: dict, i: int, res: Res, Z, Mn, dc):
    """tp > 1. Reverse of `_layer_split` (+ the predict gate) from its output cotangent dc
    (B, D): (dZ, dM', X2 = [h | scale * r] for W2o's gradient, pg). With the read scale after
    Wo its derivative needs only dc and the saved (r @ Wo, scale), all replicated, and local
    products: no reduction here (the layer's one all-reduce is its input cotangent)."""
    pg = jax.nn.sigmoid(res.zpg[i])
    dX2 = _cols(dc, fwT["W2o"][i])  # (B, tp, fb + hu): [dh | d(r @ Wo)]
    (h, r, o), pre = jax.vjp(partial(_layer_local, dm), Z, _f32(Mn))
    if not dm.memory:
        dZ, _ = pre((dX2, None, None))
        return dZ, None, h, pg
    y_r, scale = res.read[i]
    dh, dr = _split(dX2, [dm.fb, dm.hu])
    # y = ... + scale * y_r, scale = (sum(o^2) / HU + eps)^(-1/2):
    # d scale = sum_d dc * y_r, d sum(o^2) = -scale^3 / (2 HU) d scale, d o = 2 o d sum(o^2)
    dss = -0.5 * jnp.sum(dc * y_r, axis=-1, keepdims=True) * scale**3 / (dm.h * dm.u)
    sb = scale[..., None]  # (B, 1, 1) against the blocks
    dZ, dMn = pre((dh, sb * dr, 2 * o * dss[..., None]))
    return dZ, dMn, jnp.concatenate([h, sb * r], axis=-1), pg


def _memory_bwd(dm: Dims, fw: dict, stack, step, res: Res, Z, dM, keep, dX2, dpg, dg_out):
    """One predict layer's backward (tp == 1) with the write and the read, the memory's passes
    through the kernels' `grad_reduce` and `grad_update`: (dZ, X2, pg, (dzk_prev, dzw, da, dM_prev)).

    With Mi = keep stack[t], the memory entering step t after its reset, and kM = Mi^T k,
    qM = Mi^T q from the recomputation (`_memory_stack`), the step's write and read are
        w = beta (v - kM),   M' = eg Mi + k w^T,   o = eg qM + (q . k) w   (= M'^T q),
    so only (B, H, .) vectors are left to JAX's vjp (`small`); the memory-sized products are
        from M' (cotangent dM):   dw += dM^T k,  d eg += <dM, Mi>,  dk += dM w,  dMi += eg dM
        from kM, qM:              dk += Mi dkM,  dq += Mi dqM,  dMi += k dkM^T + q dqM^T
    (`grad_reduce` before the vjp, `grad_update` after it; dM_prev = keep dMi).
    The read's own memory cotangent q dO^T is never formed: it reaches M through qM."""
    t, kM, qM = step
    zw = res.Z0[..., dm.hk : dm.write_cols]
    keep_B = jnp.ones(dM.shape[:1], jnp.float32) if keep is None else keep

    def keys(zk, Z):
        return _key(dm, zk), _query(dm, _split(Z, dm.layer_cols())[3])

    def small(k, q, zw, a, Z, kM, qM):
        v, beta, g = _write_gates(dm, zw, a)
        w = beta[..., None] * (v - kM)
        eg = jnp.exp(g)
        o = eg[..., None] * qM + jnp.sum(q * k, axis=-1, keepdims=True) * w
        X2, pg = _layer_out(dm, Z, o.reshape(*o.shape[:-2], dm.hu))
        return X2, pg, w, eg, g

    (k, q), keys_vjp = jax.vjp(keys, res.zk, Z)
    (X2, pg, w, eg, _), small_vjp = jax.vjp(small, k, q, zw, fw["a"], Z, kM, qM)
    dMk, dMw, inner = dm.kernels.grad_reduce(stack, t, keep_B, dM, k, w)
    dk, dq, dzw, da, dZ, dkM, dqM = small_vjp((dX2, dpg, dMk, inner, dg_out))
    dM_prev, Mi_dkM, Mi_dqM = dm.kernels.grad_update(stack, t, keep_B, dM, k, q, dkM, dqM, eg)
    dzk_prev, dZ_q = keys_vjp((dk + dMw + Mi_dkM, dq + Mi_dqM))
    return dZ + dZ_q, X2, pg, (dzk_prev, dzw, da, dM_prev)


def _bstep(dm: Dims, fw: dict, fwT: dict, stack, bc, xs):
    """Reverse of one step. bc = (ds, dzk, dM, Mn, da): cotangents of (s', key of s, M') and M'.
    `stack`: the segment's recomputed memories when the memory's passes are the kernels'
    (`_memory_bwd`; xs then holds (t, kM, qM) where it otherwise holds M before the step, and
    the carry's Mn is None)."""
    ds, dzk, dM, Mn, da = bc
    res, Mprev, dp_out, dg_out, keep = xs  # Mprev: before this step's reset (`_reset`)
    mem_grads = None
    # ground: s' = sigmoid(zg) * p + xg
    sg = jax.nn.sigmoid(res.zg)
    dzg = ds * res.p * sg * (1 - sg)
    xp, rms_p = jax.vjp(rms, res.p)
    dc = dp_out + ds * sg + rms_p(_cols(dzg, fwT["Wg"]))[0]
    emit = {"Xg": xp, "dZg": dzg, "dxg": ds}
    # predict layers, last to first: c_{i+1} = pg * c_i + X2 @ W2o
    Z_layer0 = res.Z0[..., dm.write_cols :]
    X2s, dYs, Xls, dZls, dZpgs = [], [], [], [], []
    dZ_layer0 = None
    for i in reversed(range(dm.n_layers)):
        c_in = res.c[i - 1] if i else res.s
        Zl = res.Z[i - 1] if i else Z_layer0
        if dm.split:
            dZl, dMn, X2, pg = _layer_split_bwd(dm, fwT, i, res, Zl, Mn, dc)
            dZpgs.insert(0, dc * c_in * pg * (1 - pg))
        elif stack is not None:
            dX2 = _cols(dc, fwT["W2o"][i])
            dZl, X2, pg, mem_grads = _memory_bwd(
                dm, fw, stack, Mprev, res, Zl, dM, keep, dX2, dc * c_in, dg_out
            )
        else:
            (X2, pg), pre = jax.vjp(partial(_layer_pre, dm), Zl, _f32(Mn))
            dZl, dMn = pre((_cols(dc, fwT["W2o"][i]), dc * c_in))
        X2s.insert(0, X2)
        dYs.insert(0, dc)
        if dm.memory and stack is None:
            dM = dM + dMn
        dc = dc * pg
        if i:
            xc, rms_c = jax.vjp(rms, c_in)
            dx = _rows(dZl, fwT["Wl"][i - 1])
            if dm.split:
                dx = dx + mm(dZpgs[0], fwT["Wpg"][i])
            dc = dc + rms_c(dx)[0]
            Xls.insert(0, xc)
            dZls.insert(0, dZl)
        else:
            dZ_layer0 = dZl
    # write: M' = write(key of s_prev, [v | beta | a] of s, M)
    if mem_grads is not None:
        dzk_prev, dzw, da_t, dMprev = mem_grads  # dMprev already through the reset
        dZ0 = jnp.concatenate([dzk, dzw, dZ_layer0], axis=-1)
        da = da + da_t
    elif dm.memory:
        zw = res.Z0[..., dm.hk : dm.write_cols]
        M_in = _f32(Mprev) if keep is None else _f32(Mprev) * _rowwise(keep, Mprev)
        _, wr = jax.vjp(partial(_write, dm), res.zk, zw, fw["a"], M_in)
        dzk_prev, dzw, da_t, dMprev = wr((dM, dg_out))
        dZ0 = jnp.concatenate([dzk, dzw, dZ_layer0], axis=-1)
        da = da + da_t
    else:
        dzk_prev, dMprev, dZ0 = None, None, dZ_layer0
    xs_, rms_s = jax.vjp(rms, res.s)
    dx = _rows(dZ0, fwT["W0"])
    if dm.split:
        dx = dx + mm(dZpgs[0], fwT["Wpg"][0])
    ds_prev = dc + rms_s(dx)[0]
    emit |= {"X0": xs_, "dZ0": dZ0, "X2": X2s, "dY": dYs, "Xl": Xls, "dZl": dZls}
    emit["dZpg"] = dZpgs
    if keep is not None:  # through `_reset`: the reset part of the key is W0's key bias
        if dm.memory:
            k = _rowwise(keep, dzk_prev)
            emit["dbk"] = (1 - k) * dzk_prev
            dzk_prev = dzk_prev * k
            if mem_grads is None:
                dMprev = dMprev * _rowwise(keep, dMprev)
        ds_prev = ds_prev * keep[:, None]
    return (ds_prev, dzk_prev, dMprev, Mprev if stack is None else Mn, da), emit


def _f32(M: Array | None) -> Array | None:
    """A stored memory as float32 for the backward's vjps: the memory cotangent stays float32
    and passes the storage rounding unchanged (as autodiff passes a cast)."""
    return None if M is None else M.astype(jnp.float32)


def _memory_stack(dm: Dims, fw, M0, res: Res, keep_SxB=None):
    """By the kernels' `stack`: (Ms, kM, qM), the memory before each step (and
    its reset) of a segment, and Mi^T k, Mi^T q of each step (layer 0's query)."""
    zw = res.Z0[..., dm.hk : dm.write_cols]
    k, v, beta, g = _write_inputs(dm, res.zk, zw, fw["a"])
    q = _query(dm, _split(res.Z0[..., dm.write_cols :], dm.layer_cols())[3])
    keep = jnp.ones(res.zk.shape[:2], jnp.float32) if keep_SxB is None else keep_SxB
    return dm.kernels.stack(M0, k, q, v, beta, jnp.exp(g), keep)


def _kernel_memory(dm: Dims, M: Array) -> bool:
    """Whether the memory's passes run through the kernels (the forward's write and read, the
    backward's recomputation): `dims_of` keeps them only where they cover the memory."""
    return dm.kernels is not None and dm.memory


def _kernel_memory_bwd(dm: Dims, M: Array) -> bool:
    """Whether the backward's per-token passes over the memory do too (`_memory_bwd`): kernels
    for them, one predict layer (whose query the recomputation takes), no remat (whose segments
    rerun the forward instead)."""
    ops = dm.kernels
    has_passes = ops is not None and None not in (ops.grad_reduce, ops.grad_update)
    return _kernel_memory(dm, M) and has_passes and dm.n_layers == 1 and not dm.remat


def _recompute_memory(dm: Dims, fw, M0, res: Res, keep_SxB=None):
    """M before each step (and its reset) of a segment, from its starting memory and the
    stored write inputs; by the kernels' `stack` where the window has them (`_memory_stack`)."""
    if _kernel_memory(dm, M0):
        return _memory_stack(dm, fw, M0, res, keep_SxB)[0]

    def body(M, x):
        r, kp = x
        zw = r.Z0[..., dm.hk : dm.write_cols]
        M_in = M if kp is None else M * _rowwise(kp, M)
        return _write(dm, r.zk, zw, fw["a"], M_in)[0], M

    return jax.lax.scan(body, M0, (res, keep_SxB), unroll=dm.unroll)[1]


def _zeros_like_tree(dm: Dims, name: str, t):
    return jax.tree.map(
        lambda x: _along(dm, jnp.zeros(x.shape, jnp.float32), _BLOCK_DIM.get(name)), t
    )


def _window_bwd(dm: Dims, saved, cts):
    fw, xg, starts, res_all, MT, keep = saved
    dsT, dMT, dP, dG = cts
    S = dm.segment
    B = xg.shape[1]
    dP = _segments(dP, S)
    dG = _segments(dG, S) if dm.memory else jnp.zeros((dP.shape[0], S, B, 0), jnp.float32)
    names = ("W0", "b0", "Wl", "bl", "W2o", "Wg", "bg", "Wpg", "bpg")
    gW = {k: _zeros_like_tree(dm, k, fw[k]) for k in names}
    zk_shape = (B, *fw["b0"][..., : dm.hk].shape)
    fwT = _loop_weights(dm, _transposed(fw))
    fwh = _loop_weights(dm, _with_halves(dm, fw))

    kernel_bwd = _kernel_memory_bwd(dm, MT)

    def seg(carry, xs):
        ds, dzk, dM, Mn, da, gw = carry
        start, res, dp_seg, dg_seg, xg_seg, keep_seg = xs
        stack = None  # the kernels' (`_memory_bwd`), read in place by their passes
        if dm.remat:
            _, (_, res, Ms) = _scan_steps(dm, fwh, start, xg_seg, "resM", keep_seg)
        elif kernel_bwd:
            stack, kM, qM = _memory_stack(dm, fw, start[2], res, keep_seg)
            Ms = (jnp.arange(S, dtype=jnp.int32), kM, qM)
        elif dm.memory:
            Ms = _recompute_memory(dm, fw, start[2], res, keep_seg)
        else:
            Ms = None
        (ds, dzk, dM, Mn, da), e = jax.lax.scan(
            partial(_bstep, dm, fw, fwT, stack),
            (ds, dzk, dM, Mn, da),
            (res, Ms, dp_seg, dg_seg, keep_seg),
            reverse=True,
            unroll=dm.unroll,
        )
        gw = dict(gw)
        gw["W0"] = gw["W0"] + _wgrad(e["X0"], e["dZ0"], fw["W0"])
        gw["b0"] = gw["b0"] + _bias_grad(e["dZ0"])
        if "dbk" in e:
            gw["b0"] = gw["b0"].at[..., : dm.hk].add(_bias_grad(e["dbk"]))
        gw["Wg"] = gw["Wg"] + _wgrad(e["Xg"], e["dZg"], fw["Wg"])
        gw["bg"] = gw["bg"] + _bias_grad(e["dZg"])
        gw["W2o"] = [
            g + _wgrad(x, d, w)
            for g, x, d, w in zip(gw["W2o"], e["X2"], e["dY"], fw["W2o"], strict=True)
        ]
        gw["Wl"] = [
            g + _wgrad(x, d, w)
            for g, x, d, w in zip(gw["Wl"], e["Xl"], e["dZl"], fw["Wl"], strict=True)
        ]
        gw["bl"] = [g + _bias_grad(d) for g, d in zip(gw["bl"], e["dZl"], strict=True)]
        gate_inputs = [e["X0"], *e["Xl"]][: len(e["dZpg"])]  # each layer's rms(c_in)
        gw["Wpg"] = [
            g + _wgrad(x, d, w)
            for g, x, d, w in zip(gw["Wpg"], gate_inputs, e["dZpg"], fw["Wpg"], strict=True)
        ]
        gw["bpg"] = [g + _bias_grad(d) for g, d in zip(gw["bpg"], e["dZpg"], strict=True)]
        return (ds, dzk, dM, Mn, da, gw), e["dxg"]

    init = (
        dsT,
        _along(dm, jnp.zeros(zk_shape, jnp.float32), 1, batch=True) if dm.memory else None,
        _along(dm, dMT, 1, batch=True),
        None if kernel_bwd else _along(dm, MT, 1, batch=True),  # the kernels read `stack`
        _along(dm, jnp.zeros(fw["a"].shape, jnp.float32), 0),
        gW,
    )
    xs = (starts, res_all, dP, dG, _segments(xg, S), _segments(keep, S))
    (ds0, dzk0, dM0, _, da, gw), dxg = jax.lax.scan(seg, init, xs, reverse=True)
    dfw = {k: jax.tree.map(lambda g, w: g.astype(w.dtype), gw[k], fw[k]) for k in gw}
    dfw["a"] = da
    return dfw, ds0, dzk0, dM0, _unsegment(dxg)


# ----------------------------------------------------------------------------- entry point
def _make_window(dm: Dims):
    @jax.custom_vjp
    def window(fw, s0, zk0, M0, xg, keep=None):
        return _window_primal(dm, fw, s0, zk0, M0, xg, keep)

    def fwd(fw, s0, zk0, M0, xg, keep=None):
        return _window_fwd(dm, fw, s0, zk0, M0, xg, keep)

    def bwd(saved, cts):
        dsT, dMT, dP, dG = cts
        if dm.memory:  # float32 cotangent whatever the memory's storage dtype
            dMT = jnp.zeros(saved[4].shape, jnp.float32) if dMT is None else _f32(dMT)
        keep = saved[5]
        dfw, ds0, dzk0, dM0, dxg = _window_bwd(dm, saved, (dsT, dMT, dP, dG))
        dM0 = None if dM0 is None else dM0.astype(saved[4].dtype)
        return dfw, ds0, dzk0, dM0, dxg, None if keep is None else jnp.zeros_like(keep)

    window.defvjp(fwd, bwd)
    return window


def default_segment(T: int) -> int:
    """Memory checkpoint interval without remat: a divisor of T near max(MIN_SEGMENT, sqrt(T)).

    Its backward recomputes S memories per segment and emits S steps of activations before
    each weight-gradient matmul (contraction S * B), so S is not taken smaller than that.
    """
    target = max(MIN_SEGMENT, math.isqrt(T))
    return max(c for c in range(1, min(T, target) + 1) if T % c == 0)


def check_blocks(n_heads: int, d_ffn: int, tp: int) -> None:
    """Raises unless `tp` column blocks hold whole memory heads and equal d_ffn slices."""
    if d_ffn % tp or n_heads % tp:
        raise ValueError(
            f"scan_impl='fused' splits whole memory heads and d_ffn over the tensor axis: "
            f"n_heads={n_heads} and d_ffn={d_ffn} must be divisible by its size {tp}; use a "
            "mesh whose tensor size divides both, or --config.model.scan_impl=autodiff"
        )


def dims_of(
    params: gpn.Params,
    T: int,
    remat_segment: int = 0,
    unroll: int | None = None,
    tp: int = 1,
    tp_axis: str | None = None,
    kernels: MemoryKernels | None = None,
    memory_dtype=jnp.float32,
) -> Dims:
    """The window's static sizes. `kernels` are kept where they cover the window (one device;
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
        unroll=UNROLL if unroll is None else unroll,
        tp=tp,
        tp_axis=tp_axis if tp > 1 else None,
        **_usable_kernels(kernels, tp, mem is not None, lp["wpg"].dtype, memory_dtype),
    )


def _usable_kernels(kernels, tp, memory, param_dtype, memory_dtype) -> dict:
    """Dims' `kernels` and `products`: what of `kernels` this window uses. The kernels run on
    one device (a mesh of more than one device keeps the XLA formulas)."""
    mesh = jax.sharding.get_abstract_mesh()
    if kernels is None or tp > 1 or (not mesh.empty and mesh.size > 1):
        return {}
    covered = memory and jnp.dtype(memory_dtype).name in kernels.memory_dtypes
    return {
        "kernels": kernels if covered else None,
        "products": kernels.matmul if param_dtype == jnp.float32 else None,
    }


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
) -> tuple[GPNCarry, StepOutput]:
    """Drop-in for `window.scan_window` (no intervention): (final carry, StepOutput (T, B, ...)).
    `keep_TxB` (0 at a document start) resets the incoming carry of those steps. `tp` column
    blocks split over mesh axis `tp_axis` (the module doc; tp == 1: one device's layout).
    `kernels`: the memory's passes and products by these (`kernel_ops`); None: XLA's."""
    T = xg_TxBxD.shape[0]
    M_dtype = jnp.float32 if carry.M is None else carry.M.dtype
    dm = dims_of(cp, T, remat_segment, unroll, tp, tp_axis, kernels, M_dtype)
    fw = _shard_fused(dm, fuse_params(cp, dm.tp))
    zk0 = M0 = None
    if dm.memory:
        zk0 = _along(dm, _blocks(key_projection(cp, carry.s_prev), dm.tp), 1, batch=True)
        M0 = _along(dm, _head_blocks(carry.M, dm.tp), 1, batch=True)
    s0 = _along(dm, carry.s, None, batch=True)
    sT, MT, P, G = _make_window(dm)(fw, s0, zk0, M0, xg_TxBxD, keep_TxB)
    if not dm.memory:
        return GPNCarry(sT, None, None), StepOutput(P, None)
    MT, G = _merge_blocks(MT, dm.tp, 1), _merge_blocks(G, dm.tp, 2)
    # s_prev of the final carry is the state entering the last step: re-ground it from P.
    if T > 1:
        s_last = gpn.ground(cp["ground"], P[T - 2], xg_TxBxD[T - 2])
    else:
        s_last = carry.s
    if keep_TxB is not None:  # the last step's incoming carry was reset there
        s_last = s_last * keep_TxB[T - 1][:, None]
    return GPNCarry(sT, s_last, MT), StepOutput(P, G)


# ----------------------------------------------------------------------------- fused cross-entropy
# The loss is a sum of per-position CEs whose gradient (softmax - onehot) is known in the forward
# pass: computing it there, chunk by chunk, costs 3 decode-sized matmuls per chunk instead of
# the 4 of a rematerialised chunk (forward, recompute, two backward), and the (chunk, B, V)
# logits still never exist twice. The backward only scales the saved gradients.
def _ce_chunk_grads(x, W, bias, E, tgt):
    """CE sum of a chunk and the gradients of that sum w.r.t. (x, W, bias, E)."""
    z = mm(x, W) + bias  # (C, B, Ee)
    logits = mm(z, E.T)  # (C, B, V)
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, tgt[..., None], axis=-1)[..., 0]
    dlog = jnp.exp(logits - lse[..., None]) - jax.nn.one_hot(
        tgt, logits.shape[-1], dtype=logits.dtype
    )
    dz = mm(dlog, E)
    # float32: dE's transpose (Ee, V), with the (C, B, V) cotangent as the right operand, which
    # XLA:CPU then does not copy transposed, accumulated as such over the chunks (`_ce_fwd`;
    # transposing each chunk's, XLA folds the transpose back into a slower product); a 16-bit dot
    # with a transposed output is not supported there, hence the plain form for other dtypes
    dE = _wgrad(z, dlog, E.T) if _dE_transposed(E) else _wgrad(dlog, z, E)
    dW = _wgrad(x, dz, W)
    return jnp.sum(lse - picked), (_mm_t(dz, W), dW, _bias_grad(dz), dE)


def _dE_transposed(E: Array) -> bool:
    """Whether `_ce_chunk_grads` gives the embedding's gradient as its transpose (Ee, V)."""
    return E.dtype == jnp.float32


def _ce_primal(c, W, bias, E, P, tgt):
    def body(total, pt):
        p, t = pt
        logits = mm(mm(rms(p), W) + bias, E.T)
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, t[..., None], axis=-1)[..., 0]
        return total + jnp.sum(lse - picked), None

    return jax.lax.scan(body, jnp.zeros((), jnp.float32), (_segments(P, c), _segments(tgt, c)))[0]


def _ce_fwd(c, W, bias, E, P, tgt):
    def body(acc, pt):
        total, dW, db, dE = acc
        p, t = pt
        x, rms_p = jax.vjp(rms, p)
        ce, (dx, dW_c, db_c, dE_c) = _ce_chunk_grads(x, W, bias, E, t)
        return (total + ce, dW + dW_c, db + db_c, dE + dE_c), rms_p(dx)[0]

    f32 = lambda a: jnp.zeros(a.shape, jnp.float32)
    (total, dW, db, dE), dP = jax.lax.scan(
        body,
        (jnp.zeros((), jnp.float32), f32(W), f32(bias), f32(E.T if _dE_transposed(E) else E)),
        (_segments(P, c), _segments(tgt, c)),
    )
    dE = dE.T if _dE_transposed(E) else dE
    return total, (dW, db, dE, _unsegment(dP), W, bias, E, tgt)


def _ce_bwd(c, saved, g):
    dW, db, dE, dP, W, bias, E, tgt = saved
    zero_tgt = np.zeros(tgt.shape, dtype=jax.dtypes.float0)
    return (
        (g * dW).astype(W.dtype),
        (g * db).astype(bias.dtype),
        (g * dE).astype(E.dtype),
        g * dP,
        zero_tgt,
    )


_ce_sum = jax.custom_vjp(_ce_primal, nondiff_argnums=(0,))
_ce_sum.defvjp(_ce_fwd, _ce_bwd)


def cross_entropy_sum_fused(cp: gpn.Params, p_TxBxD: Array, targets_TxB: Array, chunk: int = 0):
    """Same value as `loss.cross_entropy_sum` over `gpn.decode`; gradients computed in the
    forward pass."""
    dp = cp["decode"]
    W = (dp["norm"][:, None] * dp["proj"].astype(jnp.float32)).astype(dp["proj"].dtype)
    bias = dp["bias"].astype(jnp.float32) if "bias" in dp else jnp.zeros((W.shape[1],), jnp.float32)
    c = loss.chunk_size(p_TxBxD.shape[0], chunk)
    return _ce_sum(c, W, bias, cp["embed"], p_TxBxD, targets_TxB)
