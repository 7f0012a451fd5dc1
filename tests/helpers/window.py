"""Shared helpers for the fused window's tests (tests/core, tests/kernels, tests/models): small
GPN(+M) model pairs (autodiff reference, fused), random parameters and carries, the kernel
choices this machine can run, and float32 bounds derived from the reduction lengths compared."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpn_jax import kernels
from gpn_jax.core.gpn import GPNCarry
from gpn_jax.models.gpn import GPN, GPNConfig
from tests import tolerance

V, B = 37, 2
NO_MEM = dict(memory=False, n_heads=0, d_key=0, d_value=0)
BASE = dict(vocab_size=V, d_model=16, d_emb=8, d_ffn=20, n_heads=3, d_key=4, d_value=5)

EPS32 = tolerance.F32_EPS  # 1.19e-7


def f32_bound(length: int, margin: float = 4.0) -> float:
    """`tests.tolerance.f32_bound` with the window tests' default margin of 4: two float32
    computations of one value that round differently along `length` sequential roundings
    (summation order, fused vs separate steps). A wrong formula, row, step or reset errs by
    O(1e-2) or more."""
    return tolerance.f32_bound(length, margin)


def window_bound(T: int, width: int = max(BASE["d_ffn"], BASE["vocab_size"])) -> float:
    """The fused window against autodiff over T steps, each step's values from contractions at
    most `width` long (the default: the test models' widest, d_ffn or the vocabulary), and the
    weight gradients summing T * B products: eps x (T * width + T * B) x 4."""
    return f32_bound(T * width + T * B)


def pair(**kw) -> tuple[GPN, GPN]:
    """(autodiff reference, fused) GPN(+M) of the same small config (`kernels` in kw or xla)."""
    cfg = GPNConfig(**(BASE | {"kernels": "xla"} | kw))
    # the reference explicitly; how the fused window's segments rerun is not its switch
    ref = dataclasses.replace(cfg, scan_impl="autodiff", remat_parallel=False)
    return GPN(ref), GPN(dataclasses.replace(cfg, scan_impl="fused"))


def tokens(t, seed=0, b=B):
    return jax.random.randint(jax.random.PRNGKey(seed + 100), (b, t), 0, V)


def random_params(model: GPN, seed: int = 0) -> dict:
    """The paper's init zeroes several gates and biases; randomise everything so every term counts."""
    params = model.init(jax.random.PRNGKey(seed))
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
    noisy = [
        jax.random.normal(k, x.shape) * (0.5 if x.ndim == 1 else 0.4 / np.sqrt(x.shape[0]))
        + (1.0 if x.ndim == 1 else 0.0)
        for k, x in zip(keys, leaves, strict=True)
    ]
    return jax.tree.unflatten(treedef, noisy)


def random_carry(model, seed=5):
    c = model.init_state(B)
    k = jax.random.split(jax.random.PRNGKey(seed), 3)
    s = jax.random.normal(k[0], c.s.shape)
    if c.M is None:
        return GPNCarry(s, None, None)
    return GPNCarry(s, jax.random.normal(k[1], c.s.shape), 0.3 * jax.random.normal(k[2], c.M.shape))


def loss_and_grads(model, params, x, carry, resets=None):
    """Loss plus a term on the final carry (so cotangents also enter through the carry);
    gradients w.r.t. the parameters and the initial carry."""

    def f(p, c):
        loss, (c2, _) = model.loss(p, x, c, resets=resets)
        on_carry = sum(jnp.sum(jnp.sin(a)) for a in jax.tree.leaves(c2))
        return loss + 0.1 * on_carry, (loss, c2)

    return jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(params, carry)


def fused_grad_hlo(model, params, x, carry) -> str:
    """The lowered (StableHLO) text of the loss gradient: names the FFI targets it calls."""
    f = jax.grad(lambda p: model.loss(p, x, carry)[0])
    return jax.jit(f).lower(params).as_text()


def native_available() -> bool:
    """Whether `model.kernels=native` runs here (a CPU where the C++ kernels build)."""
    try:
        return kernels.resolve("native", jax.default_backend()) is not None
    except kernels.KernelsUnavailable:
        return False


# The explicit choices the window's tests run on CPU (pallas: its kernels in Pallas's interpreter)
KERNEL_CHOICES = ("xla", "native", "pallas")


def require_kernels(choice: str) -> None:
    """Skips the calling test when `model.kernels=choice` cannot run here (xla always runs, so
    the XLA formulas are covered whatever the CPU)."""
    if choice == "native" and not native_available():
        pytest.skip("model.kernels=native: the C++ kernels are unavailable here")
