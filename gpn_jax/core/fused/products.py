"""The fused window's products: per-token projections (`cols`, `rows`, through a product
kernel's packed weights where the window has one) and the weight gradients, each one matmul
over a segment's stacked (steps, batch) rows (`wgrad`, `bias_grad`)."""

import dataclasses

import jax
import jax.numpy as jnp

from gpn_jax.core.fused.layout import Dims

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Packed:
    """A weight matrix packed once per window for a product kernel (`ProductKernel`)."""

    operand: object  # the kernel's packed operand (a pytree)
    matmul: object  # (x, operand) -> x @ W float32

    def __call__(self, x: Array) -> Array:
        return self.matmul(x, self.operand)


jax.tree_util.register_dataclass(Packed, data_fields=["operand"], meta_fields=["matmul"])


def cols(x: Array, w: Array | Packed) -> Array:
    """x (B, D) @ w (D, ...) in w's dtype, float32 out: (B, ...)."""
    if isinstance(w, Packed):
        return w(x)
    return jax.lax.dot_general(
        x.astype(w.dtype), w, (((x.ndim - 1,), (0,)), ((), ())), preferred_element_type=jnp.float32
    )


def rows(x: Array, w: Array | Packed) -> Array:
    """x (B, ...) contracted with w (..., D) over all of w's leading axes, float32 out: (B, D).
    With blocks split over `tensor` the contraction spans them: a partial sum per device."""
    if isinstance(w, Packed):
        return w(x)
    n = w.ndim - 1
    dims = (tuple(range(x.ndim - n, x.ndim)), tuple(range(n)))
    return jax.lax.dot_general(
        x.astype(w.dtype), w, (dims, ((), ())), preferred_element_type=jnp.float32
    )


def padded_to(dz: Array, w: Array | Packed) -> Array:
    """The cotangent dz (..., n) zero-padded along its last axis to the contraction rows of a
    transposed projection w (..., n', D) (`layout.transposed`); as it is for a packed one."""
    if isinstance(w, Packed) or w.shape[-2] == dz.shape[-1]:
        return dz
    return jnp.pad(dz, [(0, 0)] * (dz.ndim - 1) + [(0, w.shape[-2] - dz.shape[-1])])


def mm_t(dz: Array, w: Array) -> Array:
    """dz @ w.T in w's dtype, float32 out (the input cotangent of `mm(x, w)`)."""
    return jax.lax.dot_general(
        dz.astype(w.dtype),
        w,
        (((dz.ndim - 1,), (1,)), ((), ())),
        preferred_element_type=jnp.float32,
    )


def loop_weights(dm: Dims, fw: dict) -> dict:
    """The matrices a per-token loop multiplies by (`fw`'s or `transposed(fw)`'s), packed once
    outside the loop for the product kernel `dm.products` (one device, float32)."""
    if dm.products is None:
        return fw
    pack = lambda w: Packed(dm.products.pack(w), dm.products.matmul)
    single = {k: pack(fw[k]) for k in ("W0", "Wg")}
    per_layer = {k: [pack(w) for w in fw[k]] for k in ("Wl", "W2o")}
    return fw | single | per_layer


def wgrad(x_SxBxI: Array, dz_SxBxO: Array, w: Array) -> Array:
    """sum over (s, b) of x^T dz: one matmul with contraction S*B, float32. Blocks ride along:
    (S, B, [tp,] I) x (S, B, [tp,] O) -> ([tp,] I, [tp,] O), nothing contracted over them.

    Contracted as (I, S*B) @ (S*B, O): an einsum over (s, b) lowers to a dot contracting
    (b, s), for which XLA transposes both operands (a copy of each). The small x^T is
    materialised on CPU (an optimisation barrier keeps XLA from folding the transpose back into
    the dot): XLA:CPU ran the dot contracting both operands' first axis markedly slower for the
    loss's (256 x 512) @ (512 x 8192) embedding gradient (`python experiments/bench/loop_costs.py`)."""
    n = x_SxBxI.shape[0] * x_SxBxI.shape[1]
    x_t = x_SxBxI.reshape(n, -1).astype(w.dtype).T
    if jax.default_backend() == "cpu":  # accelerators' dots take transposed operands as they are
        x_t = jax.lax.optimization_barrier(x_t)
    out = jnp.matmul(
        x_t, dz_SxBxO.reshape(n, -1).astype(w.dtype), preferred_element_type=jnp.float32
    )
    return out.reshape(*x_SxBxI.shape[2:], *dz_SxBxO.shape[2:])


def bias_grad(dz_SxBxO: Array) -> Array:
    """sum over (s, b) of dz as a (1, S*B) @ (S*B, O) product (XLA:CPU reduces over the
    leading axes several times slower than it multiplies by ones)."""
    n = dz_SxBxO.shape[0] * dz_SxBxO.shape[1]
    dz = dz_SxBxO.reshape(n, -1)
    return (jnp.ones((n,), dz.dtype) @ dz).reshape(dz_SxBxO.shape[2:])


def segments(x: Array | None, S: int) -> Array | None:
    return None if x is None else x.reshape(x.shape[0] // S, S, *x.shape[1:])


def unsegment(x: Array) -> Array:
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])
