"""The per-token product kernel (`gpn_jax.kernels.cpu.small_matmul`): equal to the product it
replaces, used by the fused window with `model.kernels=native` on one float32 CPU device, and
XLA's products where it is not chosen or cannot be used."""

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpn_jax import kernels
from gpn_jax.core.fused import window as fused_window
from gpn_jax.kernels.cpu import small_matmul
from tests.helpers.window import (
    f32_bound,
    fused_grad_hlo,
    pair,
    random_carry,
    require_kernels,
    tokens,
    window_bound,
)
from tests.tolerance import assert_rel_close, rel_err


@pytest.fixture
def native():
    require_kernels("native")
    return kernels.resolve("native", "cpu")


@pytest.mark.parametrize(
    "M,K,N",
    [(16, 512, 4872), (8, 4872, 512), (1, 5, 1), (3, 7, 47), (13, 33, 48), (20, 64, 49)],
)
def test_product_equals_float64_to_round_off(native, M, K, N):
    """Rows past a multiple of the register tile, columns short of, at and past a column tile,
    against float64: a float32 sum of K products (eps x K); a wrong tile, tail or stride errs
    by O(1)."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(M * 1000 + N))
    x, w = jax.random.normal(k1, (M, K)), jax.random.normal(k2, (K, N))
    got = jax.jit(lambda x, w: small_matmul.matmul(x, small_matmul.pack(w)))(x, w)
    assert got.shape == (M, N) and got.dtype == jnp.float32
    want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    assert rel_err(got, want) < f32_bound(K, margin=1.0)


def test_product_keeps_leading_axes(native):
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 10))
    w = jax.random.normal(jax.random.PRNGKey(1), (10, 50))
    got = small_matmul.matmul(x, small_matmul.pack(w))
    assert got.shape == (2, 3, 50)
    want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    assert rel_err(got, want) < f32_bound(10, margin=1.0)  # sums of 10 products


def _model(kernels: str, **kw):
    """The helpers' small GPN+M, L = 2, fused."""
    return pair(kernels=kernels, n_layers=2, **kw)[1]


def test_fused_window_multiplies_through_the_kernel(native):
    """Float32 on one device with `model.kernels=native`: the loops' products are the kernel's;
    `xla` gives XLA's, with the same loss and gradients (T = 9 steps rounded in another order)."""
    model = _model("native")
    params = model.init(jax.random.PRNGKey(0))
    x, carry = tokens(9), random_carry(model)

    def lowered(m):
        """`loss_and_grads`'s program (gradients for the parameters and the initial carry),
        lowered once: its text checked, then run."""

        def f(p, c):
            loss, (c2, _) = m.loss(p, x, c)
            return loss + 0.1 * sum(jnp.sum(jnp.sin(a)) for a in jax.tree.leaves(c2)), loss

        grad = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)
        return jax.jit(grad).lower(params, carry)

    native_program, xla_program = lowered(model), lowered(_model("xla"))
    assert small_matmul.TARGET in native_program.as_text()
    assert small_matmul.TARGET not in xla_program.as_text()
    (_, loss), grads = native_program.compile()(params, carry)
    (_, loss_xla), grads_xla = xla_program.compile()(params, carry)
    assert_rel_close(loss, loss_xla, window_bound(9), "loss")
    assert_rel_close(grads, grads_xla, window_bound(9), "kernel against XLA's products")


def test_bfloat16_compute_and_meshes_keep_xlas_products(native):
    """The kernel is float32 and one device's: bf16 compute and a 2-device mesh trace without it."""
    model = _model("native", compute_dtype="bfloat16")
    params = model.init(jax.random.PRNGKey(0))
    x, carry = tokens(9), random_carry(model)
    assert small_matmul.TARGET not in fused_grad_hlo(model, params, x, carry)
    f32_params = _model("native").init(jax.random.PRNGKey(0))
    assert fused_window.dims_of(f32_params, 9, kernels=native).products is not None
    mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
    with jax.set_mesh(mesh):
        dm = fused_window.dims_of(f32_params, 9, kernels=native)
    assert dm.products is None and dm.kernels is None


def test_a_failed_build_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", shutil.which("false") or "false")
    with pytest.raises(RuntimeError, match=r"small_matmul\.cc .*failed"):
        small_matmul.build(tmp_path / "k.so")
    assert not (tmp_path / "k.so").exists()
    assert list(tmp_path.iterdir()) == []  # no partial library left behind


@pytest.mark.parametrize(
    "flags,on",
    [
        ({"avx2", "avx512f"}, True),
        ({"avx2", "fma"}, True),
        ({"avx", "sse4_2"}, False),
        ({"avx2"}, False),
    ],
)
def test_auto_uses_the_kernel_only_on_avx512_or_avx2_fma_cpus(monkeypatch, flags, on):
    """`auto` uses it where it was measured faster (AVX-512, AVX2 + FMA). The status line the
    bench prints says which, and how to choose it anyway."""
    monkeypatch.setattr(small_matmul, "_cpu_flags", lambda: flags)
    monkeypatch.setattr(small_matmul, "load", lambda: 48)  # as if built: no compiler needed
    assert small_matmul.measured_faster(flags) is on
    if jax.default_backend() != "cpu":
        return
    status = small_matmul.status()
    if on:
        assert status == "native kernel (48-column tiles)"
    else:
        assert status == "XLA's (neither AVX-512 nor AVX2+FMA; model.kernels=native for the kernel)"
