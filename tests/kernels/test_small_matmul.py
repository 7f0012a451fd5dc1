"""The per-token product kernel (`gpn_jax.native.small_matmul`): equal to the product it replaces,
used by the fused window on one CPU device (by default where the CPU has AVX-512, or AVX2 and
FMA), and XLA's products where it cannot be or is not wanted."""

import logging
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpn_jax.core import fast_window
from gpn_jax.native import small_matmul
from tests.core.test_fast_window import loss_and_grads, pair, random_carry, tokens
from tests.tolerance import assert_rel_close, rel_err

needs_compiler = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "c++")) is None,
    reason="no C++ compiler: the fused window keeps XLA's products (tested below)",
)


@pytest.fixture
def fresh_kernel():
    """`small_matmul`'s load forgotten before and after the test (the next use loads again)."""
    small_matmul._tile.cache_clear()
    yield
    small_matmul._tile.cache_clear()


@needs_compiler
@pytest.mark.parametrize(
    "M,K,N",
    [(16, 512, 4872), (8, 4872, 512), (1, 5, 1), (3, 7, 47), (13, 33, 48), (20, 64, 49)],
)
def test_product_equals_float64_to_round_off(M, K, N):
    """Rows past a multiple of the register tile, columns short of, at and past a column tile.
    Measured against float64 (2026-12-03, AVX-512): 3e-8 to 1.2e-6, as XLA's own float32
    product (3e-8 to 4e-7); a wrong tile, tail or stride errs by O(1)."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(M * 1000 + N))
    x, w = jax.random.normal(k1, (M, K)), jax.random.normal(k2, (K, N))
    got = jax.jit(lambda x, w: small_matmul.matmul(x, small_matmul.pack(w)))(x, w)
    assert got.shape == (M, N) and got.dtype == jnp.float32
    want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    assert rel_err(got, want) < 1e-5


@needs_compiler
def test_product_keeps_leading_axes():
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 10))
    w = jax.random.normal(jax.random.PRNGKey(1), (10, 50))
    got = small_matmul.matmul(x, small_matmul.pack(w))
    assert got.shape == (2, 3, 50)
    assert rel_err(got, np.asarray(x, np.float64) @ np.asarray(w, np.float64)) < 1e-5


def _model(**kw):
    """test_fast_window's small GPN+M, L = 2, fused (`pair`'s second)."""
    return pair(n_layers=2, **kw)[1]


def _fused_grad_hlo(model, params, x, carry) -> str:
    f = jax.grad(lambda p: model.loss(p, x, carry)[0])
    return jax.jit(f).lower(params).as_text()


@needs_compiler
def test_fused_window_multiplies_through_the_kernel(monkeypatch):
    """Float32 on one device with GPN_JAX_NATIVE=1: the loops' products are the kernel's (and
    the backward's memories `memory_stack`'s); GPN_JAX_NATIVE=0 gives XLA's, with the same loss
    and gradients. Measured (2026-12-03): the losses equal, the gradients within 1.0e-6 of
    their norms (AVX-512, products only) and 3.8e-7 (AVX2, with the memory kernel); the fused
    window on XLA's products against plain autodiff: 1.0-1.1e-6. The bounds allow 20x."""
    model = _model()
    params = model.init(jax.random.PRNGKey(0))
    x, carry = tokens(9), random_carry(model)
    monkeypatch.setenv("GPN_JAX_NATIVE", "1")
    assert small_matmul.TARGET in _fused_grad_hlo(model, params, x, carry)
    (_, (loss, _)), grads = loss_and_grads(model, params, x, carry)
    monkeypatch.setenv("GPN_JAX_NATIVE", "0")
    assert small_matmul.TARGET not in _fused_grad_hlo(model, params, x, carry)
    (_, (loss_xla, _)), grads_xla = loss_and_grads(model, params, x, carry)
    assert abs(float(loss) - float(loss_xla)) <= 1e-6 * abs(float(loss_xla))
    assert_rel_close(grads, grads_xla, 2e-5, "kernel against XLA's products")


def test_bfloat16_compute_and_meshes_keep_xlas_products(monkeypatch):
    """The kernel is float32 and one device's: bf16 compute and a 2-device mesh trace without it."""
    monkeypatch.setenv("GPN_JAX_NATIVE", "1")
    model = _model(compute_dtype="bfloat16")
    params = model.init(jax.random.PRNGKey(0))
    x, carry = tokens(9), random_carry(model)
    assert small_matmul.TARGET not in _fused_grad_hlo(model, params, x, carry)
    mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
    with jax.set_mesh(mesh):
        assert not small_matmul.available()
        dm = fast_window.dims_of(params, 9)
    assert not dm.native


def test_without_a_compiler_the_window_keeps_xlas_products(
    fresh_kernel, monkeypatch, tmp_path, caplog
):
    monkeypatch.setenv("GPN_JAX_NATIVE", "1")
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    monkeypatch.setenv("GPN_JAX_NATIVE_CACHE", str(tmp_path / "cache"))
    with caplog.at_level(logging.WARNING):
        assert not small_matmul.available()
    assert "native matmul kernel unavailable" in caplog.text
    assert "no C++ compiler" in caplog.text
    model = _model()
    params = model.init(jax.random.PRNGKey(0))
    assert not fast_window.dims_of(params, 9).native
    x, carry = tokens(9), random_carry(model)
    assert small_matmul.TARGET not in _fused_grad_hlo(model, params, x, carry)
    ref = pair(n_layers=2)[0]  # the same model, plain autodiff
    (_, (loss, _)), grads = loss_and_grads(model, params, x, carry)
    (_, (loss_ref, _)), grads_ref = loss_and_grads(ref, params, x, carry)
    assert abs(float(loss) - float(loss_ref)) <= 1e-6 * abs(float(loss_ref))
    assert_rel_close(grads, grads_ref, 2e-5, "fused window on XLA's products")


def test_a_failed_build_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", shutil.which("false") or "false")
    with pytest.raises(RuntimeError, match=r"small_matmul\.cc .*failed"):
        small_matmul.build(tmp_path / "k.so")
    assert not (tmp_path / "k.so").exists()
    assert list(tmp_path.iterdir()) == []  # no partial library left behind


@pytest.mark.parametrize(
    "setting,flags,on",
    [
        ("auto", {"avx2", "avx512f"}, True),
        ("auto", {"avx2", "fma"}, True),
        ("auto", {"avx", "sse4_2"}, False),
        ("auto", {"avx2"}, False),
        ("1", {"avx2"}, True),
        ("0", {"avx512f"}, False),
    ],
)
def test_by_default_only_avx512_or_avx2_fma_cpus_use_the_kernel(monkeypatch, setting, flags, on):
    """`auto` uses it where it was measured faster (AVX-512, AVX2 + FMA); `1` anywhere; `0`
    nowhere. The status line the bench prints says which, and how to change it."""
    monkeypatch.setenv("GPN_JAX_NATIVE", setting)
    monkeypatch.setattr(small_matmul, "_cpu_flags", lambda: flags)
    monkeypatch.setattr(small_matmul, "_tile", lambda: 48)  # as if built: no compiler needed
    assert small_matmul.available() is on
    status = small_matmul.status()
    if on:
        assert status == "native kernel (48-column tiles)"
    elif setting == "auto":
        assert status == "XLA's (neither AVX-512 nor AVX2+FMA; GPN_JAX_NATIVE=1 for the kernel)"
    else:
        assert status == "XLA's (GPN_JAX_NATIVE=0)"


def test_a_bad_setting_is_named(monkeypatch):
    monkeypatch.setenv("GPN_JAX_NATIVE", "yes")
    with pytest.raises(ValueError, match=r"GPN_JAX_NATIVE must be auto, 0 or 1, got 'yes'"):
        small_matmul.available()
