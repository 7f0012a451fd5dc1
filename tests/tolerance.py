"""Float comparisons that do not amplify round-off: each array's error relative to its norm.

An element-wise `rtol` fails on entries near zero, where the float32 summation order (AVX2 vs
AVX-512 kernels, XLA's fusion choices, a different sharding) moves the last bits of a tiny
number by a large *relative* amount while the array as a whole agrees to ~1e-7. The norm-relative
error ||a - b|| / ||b|| is what a real bug moves (a wrong sign, scale, divisor, index or a
missing term changes it by O(1e-2) or more) and round-off does not.

Bounds are derived, not measured: a float32 sum of n terms computed in two different orders
differs by at most about n x eps relative to the sum of the terms' magnitudes (eps = 2**-23,
float32's spacing at 1; the standard worst-case bound for recursive summation), so a comparison of
two float32 computations whose longest chain of dependent roundings has n terms gets
`f32_bound(n, margin)`. The margin covers what the term count leaves out (cancellation, a few
chained reductions, the nonlinearities between them) and is stated at each call site with n, e.g.
`f32_bound(256 + 2048, 8)  # d_model dot, then the vocab's logsumexp; x8 for the cell's chain`.
Call sites never use an error read off one machine.
"""

import jax
import numpy as np

F32_EPS = 2.0**-23  # float32's spacing at 1.0 (numpy's finfo(float32).eps, 1.19e-7)


def f32_bound(n_terms: int, margin: float) -> float:
    """margin x n_terms x float32 eps: the relative error bound of comparing two float32
    results whose longest dependent reduction has `n_terms` terms (summed in any order).

    Linear in n (the worst case, not the sqrt(n) of random rounding): the comparisons here pit
    kernels that differ systematically (a blocked vs a sequential sum, a sharded reduction), where
    the rounding errors need not cancel."""
    assert n_terms >= 1 and margin >= 1, (n_terms, margin)
    return float(margin * n_terms * F32_EPS)


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
