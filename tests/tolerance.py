"""Float comparisons that do not amplify round-off: each array's error relative to its norm.

An element-wise `rtol` fails on entries near zero, where the float32 summation order (AVX2 vs
AVX-512 kernels, XLA's fusion choices, a different sharding) moves the last bits of a tiny
number by a large *relative* amount while the array as a whole agrees to ~1e-7. The norm-relative
error ||a - b|| / ||b|| is what a real bug moves (a wrong sign, scale, divisor, index or a
missing term changes it by O(1e-2) or more) and round-off does not. Bounds passed here are the
error measured on a 2-core AVX2 machine times a margin of 10-50x for other machines; each call
site says what it measured.
"""

import jax
import numpy as np


def rel_err(actual, desired) -> float:
    """||actual - desired|| / ||desired|| in float64 (an all-zero `desired`: ||actual||)."""
    a, b = np.asarray(actual, np.float64), np.asarray(desired, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    norm = np.linalg.norm(b.ravel())
    return float(np.linalg.norm((a - b).ravel()) / (norm if norm > 0 else 1.0))


def assert_rel_close(actual, desired, bound: float, what: str = ""):
    """Every leaf of the pytree `actual` is within `bound` of `desired`'s leaf, relative to the
    norm of that leaf (see `rel_err`); the error names every leaf over the bound."""
    got = jax.tree_util.tree_leaves_with_path(actual)
    want = jax.tree.leaves(desired)
    assert jax.tree.structure(actual) == jax.tree.structure(desired), what
    errs = {jax.tree_util.keystr(p): rel_err(a, b) for (p, a), b in zip(got, want, strict=True)}
    bad = {k: e for k, e in errs.items() if not e <= bound}
    assert not bad, f"{what}: relative error over {bound:.1e} at {bad}"
    return errs
