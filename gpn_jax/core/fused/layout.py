"""The fused window's static sizes (`Dims`) and its parameter layout: RMSNorm weights folded
into their matrices, projections of one vector concatenated, in tensor-parallel column blocks.

Every projection of a vector through an RMSNorm weight is `rms(x) @ (diag(w) W)`, so the norm
weights fold into their matrices (outside the loop, by ordinary differentiable JAX ops) and
projections of the same vector concatenate into one matmul (`fuse_params`): per token one
`rms(s) @ W0` serves the write (key, value, beta, decay) and predict layer 0 (ffn, gate, query,
read gate); one `[h | r] @ [W2; diag(out_norm) Wo]` gives ffn + read; one `rms(c) @ Wl` per
further layer; one `rms(p) @ diag(g) Wgate`.

**Tensor parallelism** (`Dims.tp` > 1, the size of the mesh axis that splits memory heads and
d_ffn, which `GPN.partitioned` takes from the sharding rules and the mesh). Megatron style with
GSPMD partitioning, as the autodiff scan: each fused matrix is laid out "tp-major" so that the
`tensor` split lines up with the parameters' shards. Every column block split over `tensor`
(the write's key / value / beta / decay and the read's query / gate columns, per head; SwiGLU's
gate and up) is reshaped from (D, n) to (D, tp, n / tp) and the blocks concatenated along the
last axis: W0 is (D, tp, N0 / tp), axis 1 split over `tensor` (`along`); the row-parallel W2o
is (tp, R / tp, D) and the memory (B, tp, H / tp, K, U). Elementwise stages then act on each
device's (B, tp, n / tp) block, and splitting the last axis never crosses devices. Columns that
`tensor` does not split (the predict gate wpg, D x D; the ground gate) are replicated
projections of their own, computed on every device. The read norm's sum of squares spans all
heads, so its per-row scale multiplies the row-parallel product, y = h @ W2 + scale * (r @ Wo)
(as `core.gpn.memory_read`): the layer's partial sums h @ W2, r @ Wo and sum(o^2) are
independent and XLA reduces them in one all-reduce per layer and step. The backward saves
(r @ Wo, scale), both replicated, so the scale's derivative is local
(`fused.backward.layer_split_bwd`) and its one all-reduce per layer is the input cotangent
dZ @ W^T of the column-parallel projection (contracted over the blocks); weight gradients stay
local. tp must divide n_heads and d_ffn (else an error). With tp == 1 there is no block axis:
the predict gate stays in W0 and the read scale is applied before W2o.
"""

import dataclasses

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from gpn_jax.core import gpn
from gpn_jax.core.kernel_ops import MemoryKernels, ProductKernel
from gpn_jax.core.norms import mm, rms

Array = jax.Array

UNROLL = 1  # lax.scan unroll of the per-token loops (1 compiles fastest)


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
    # with remat: the forward keeps each step's memory reads, and the backward reruns a
    # segment's products for all its steps at once, not token by token (`fused.backward`)
    remat_parallel: bool = False
    unroll: int = UNROLL
    tp: int = 1  # column blocks of the fused matrices (the tensor axis size; module doc)
    tp_axis: str | None = None  # the mesh axis the blocks are split over; None: unconstrained
    kernels: MemoryKernels | None = None  # the memory's passes by these kernels (`kernel_ops`)
    products: ProductKernel | None = None  # loops multiply by packed weights (`loop_weights`)

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

    @property
    def kernel_passes(self) -> bool:
        """Whether the memory's passes run through `kernels` (the forward's write and read, the
        backward's recomputation): `dims_of` keeps kernels only where they cover the memory."""
        return self.kernels is not None and self.memory

    @property
    def kernel_backward(self) -> bool:
        """Whether the backward's per-token passes over the memory do too
        (`fused.backward.memory_bwd`): kernels for them and one predict layer (whose query the
        recomputation takes); with remat the kernels' `stack` rebuilds each rerun segment's
        memories."""
        ops = self.kernels
        has_passes = ops is not None and ops.grad is not None
        return self.kernel_passes and has_passes and self.n_layers == 1

    def layer_cols(self) -> list[int]:
        """Column widths of a predict layer's fused input projection [w1 | w3 | wpg | wq | wrg]
        (per block; without wpg when `split`)."""
        cols = [self.fb, self.fb] + ([] if self.split else [self.d])
        return cols + ([self.hk, self.hu] if self.memory else [])


def col_blocks(x: Array, tp: int) -> Array:
    """(..., n) -> (..., tp, n / tp): the column blocks a `tensor` split of n gives each device
    (contiguous, as `NamedSharding` splits a parameter); unchanged when tp == 1."""
    return x if tp == 1 else x.reshape(*x.shape[:-1], tp, x.shape[-1] // tp)


def row_blocks(w: Array, tp: int) -> Array:
    """(n, D) -> (tp, n / tp, D): a row-parallel matrix's blocks; unchanged when tp == 1."""
    return w if tp == 1 else w.reshape(tp, w.shape[0] // tp, w.shape[1])


def head_blocks(M: Array, tp: int) -> Array:
    """(B, H, K, U) -> (B, tp, H / tp, K, U); unchanged when tp == 1."""
    return M if tp == 1 else M.reshape(M.shape[0], tp, M.shape[1] // tp, *M.shape[2:])


def merge_blocks(x: Array, tp: int, axis: int) -> Array:
    """Inverse of the block reshapes: merges `axis` (the blocks) with the next one."""
    if tp == 1:
        return x
    return x.reshape(*x.shape[:axis], x.shape[axis] * x.shape[axis + 1], *x.shape[axis + 2 :])


# The dimension of each fused weight that holds its blocks (the others are replicated).
BLOCK_DIM = {"W0": 1, "b0": 0, "Wl": 1, "bl": 0, "W2o": 0, "a": 0}


def along(dm: Dims, x: Array | None, dim: int | None, batch: bool = False):
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


def shard_fused(dm: Dims, fw: dict) -> dict:
    return {
        name: jax.tree.map(lambda x, d=BLOCK_DIM.get(name): along(dm, x, d), v)
        for name, v in fw.items()
    }


def _fold(norm: Array, w: Array) -> Array:
    """diag(norm) W in W's dtype (the product in float32)."""
    return (norm[:, None] * w.astype(jnp.float32)).astype(w.dtype)


def _zero_bias(w: Array) -> Array:
    return jnp.zeros((w.shape[1],), jnp.float32)


def _concat(pairs, tp: int):
    """[(matrix (D, n), bias (n,))] -> blocks concatenated: (D, [tp,] N), ([tp,] N)."""
    mats = [col_blocks(m, tp) for m, _ in pairs]
    biases = [col_blocks(b.astype(jnp.float32), tp) for _, b in pairs]
    return jnp.concatenate(mats, axis=-1), jnp.concatenate(biases, axis=-1)


def _layer_projections(lp: dict, memory: bool, tp: int):
    """A layer's input projections [w1, w3, (wpg), wq, wrg] and, when tp > 1, wpg apart: its D
    columns are not split over `tensor`, so every device computes them."""
    pairs = [(_fold(lp["ffn_norm"], lp[n]), _zero_bias(lp[n])) for n in ("w1", "w3")]
    gate = (_fold(lp["pg_norm"], lp["wpg"]), lp["bpg"])
    read = []
    if memory:
        wrg = _fold(lp["read_norm"], lp["wrg"])
        read = [(_fold(lp["read_norm"], lp["wq"]), lp["bq"]), (wrg, _zero_bias(wrg))]
    if tp == 1:
        return pairs + [gate] + read, None
    return pairs + read, gate


def _write_projections(cp: gpn.Params) -> list:
    """The write's [wk, wv, wbeta, wa] with their biases, the norm folded in."""
    wp = cp["write"]
    out = [(_fold(wp["norm"], wp["wk"]), wp["bk"])]
    out += [(_fold(wp["norm"], wp[n]), _zero_bias(wp[n])) for n in ("wv", "wbeta")]
    return out + [(_fold(wp["norm"], wp["wa"]), wp["dt_bias"])]


def fuse_params(cp: gpn.Params, tp: int = 1) -> dict:
    """Folds RMSNorm weights into their matrices and concatenates projections of one vector,
    in `tp` column blocks (module doc; tp == 1: one block, no block axis).

    Differentiable: gradients of the fused weights flow back to the original parameters.
    """
    mem = gpn.has_memory(cp)
    f32 = jnp.float32
    write = _write_projections(cp) if mem else []
    fw = {"Wl": [], "bl": [], "W2o": [], "Wpg": [], "bpg": []}
    for i, name in enumerate(gpn.layer_names(cp)):
        lp = cp[name]
        pairs, gate = _layer_projections(lp, mem, tp)
        W, b = _concat(write + pairs if i == 0 else pairs, tp)
        if i == 0:
            fw["W0"], fw["b0"] = W, b
        else:
            fw["Wl"].append(W)
            fw["bl"].append(b)
        if gate is not None:
            fw["Wpg"].append(gate[0])
            fw["bpg"].append(gate[1].astype(f32))
        out = [lp["w2"]] + ([_fold(lp["out_norm"], lp["wo"])] if mem else [])
        fw["W2o"].append(jnp.concatenate([row_blocks(w, tp) for w in out], axis=-2))
    fw["Wg"] = _fold(cp["ground"]["gate_norm"], cp["ground"]["gate_w"])
    fw["bg"] = cp["ground"]["gate_b"].astype(f32)
    fw["a"] = col_blocks(jnp.exp(cp["write"]["A_log"]), tp) if mem else jnp.zeros((0,), f32)
    return fw


def key_projection(cp: gpn.Params, s: Array) -> Array:
    """The write key pre-activation of `s` (bias included): W0's first column block."""
    wp = cp["write"]
    return mm(rms(s) * wp["norm"], wp["wk"]) + wp["bk"]


# XLA:GPU splits a long contraction over several thread blocks (split-K) and pads it to a
# multiple of the split where it is not one, inside the per-token loop: the whole weight copied
# at every step (the 130M backward's W0^T, 137 MB per token step on an H100). The backward's
# long contractions over a projection's outputs are padded once, outside the loop, instead.
CONTRACTION_ALIGN = 1024
LONG_CONTRACTION = 16 * CONTRACTION_ALIGN  # shorter ones add too many zero rows in proportion


def contraction_rows(dm: Dims, n: int) -> int:
    """The rows a transposed projection of `n` outputs is padded to (`transposed`): n rounded
    up to a multiple of CONTRACTION_ALIGN where n is long and XLA runs the loop's products (not
    a CPU product kernel, which packs its operand); n otherwise."""
    if dm.products is not None or n < LONG_CONTRACTION:
        return n
    return -(-n // CONTRACTION_ALIGN) * CONTRACTION_ALIGN


def _pad_rows(dm: Dims, w: Array) -> Array:
    """w (..., n, D) with zero rows up to `contraction_rows` (the cotangent is padded to match,
    `products.padded_to`)."""
    extra = contraction_rows(dm, w.shape[-2]) - w.shape[-2]
    return w if not extra else jnp.pad(w, [(0, 0)] * (w.ndim - 2) + [(0, extra), (0, 0)])


def transposed(dm: Dims, fw: dict) -> dict:
    """The matrices the backward loop multiplies cotangents by, transposed once outside the loop
    (XLA:CPU runs a (B, N) @ (N, D) product much faster than (B, N) contracted with (D, N)).
    Column blocks (D, [tp,] N) -> ([tp,] N', D), N' = `contraction_rows`; row blocks
    ([tp,] R, D) -> (D, [tp,] R)."""
    return {
        "W0": _pad_rows(dm, jnp.moveaxis(fw["W0"], 0, -1)),
        "Wl": [_pad_rows(dm, jnp.moveaxis(w, 0, -1)) for w in fw["Wl"]],
        "W2o": [jnp.moveaxis(w, -1, 0) for w in fw["W2o"]],
        "Wg": fw["Wg"].T,
        "Wpg": [w.T for w in fw["Wpg"]],
    }


def with_halves(dm: Dims, fw: dict) -> dict:
    """tp > 1: W2o's [W2; Wo] halves for the forward's two row-parallel products, sliced
    once outside the loop (along each block's rows: no data moves between devices)."""
    if not dm.split:
        return fw
    return fw | {
        "W2": [w[:, : dm.fb] for w in fw["W2o"]],
        "Wo": [w[:, dm.fb :] for w in fw["W2o"]],
    }


def check_blocks(n_heads: int, d_ffn: int, tp: int) -> None:
    """Raises unless `tp` column blocks hold whole memory heads and equal d_ffn slices."""
    if d_ffn % tp or n_heads % tp:
        raise ValueError(
            f"scan_impl='fused' splits whole memory heads and d_ffn over the tensor axis: "
            f"n_heads={n_heads} and d_ffn={d_ffn} must be divisible by its size {tp}; use a "
            "mesh whose tensor size divides both, or --config.model.scan_impl=autodiff"
        )
