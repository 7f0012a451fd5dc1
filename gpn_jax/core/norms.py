"""Normalisations and the mixed-precision matmul shared by every model.

All pure JAX: no Flax, no configs. Norms always compute in float32, whatever the
compute dtype of the matrices, because the GPN state and memory stay float32.
"""

import jax
import jax.numpy as jnp

Array = jax.Array

RMS_EPS = 1e-6
L2_EPS = 1e-12


def rms(x: Array) -> Array:
    """`x / sqrt(mean(x**2) + 1e-6)` over the last axis, in float32."""
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + RMS_EPS)


def rms_norm(x: Array, weight: Array) -> Array:
    """RMSNorm with a learned per-feature weight (the paper's norm weight)."""
    return rms(x) * weight


def l2n(x: Array) -> Array:
    """`x / sqrt(sum(x**2) + 1e-12)` over the last axis."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + L2_EPS)


def mm(x: Array, w: Array) -> Array:
    """`x @ w` in the dtype of `w` (the compute dtype), accumulated and returned in float32."""
    return jnp.matmul(x.astype(w.dtype), w, preferred_element_type=jnp.float32)


def cast_matrices(params, dtype) -> dict:
    """Casts every matrix (ndim >= 2) of a parameter tree to `dtype`; vectors stay as they are.

    Done once per window, outside the scan, so the per-token loop never re-casts weights.
    """
    dtype = jnp.dtype(dtype)
    return jax.tree.map(lambda p: p.astype(dtype) if p.ndim >= 2 else p, params)
