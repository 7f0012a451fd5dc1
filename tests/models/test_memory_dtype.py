"""`GPNConfig.memory_dtype`: the matrix memory stored in bfloat16 between tokens, updated and read
in float32, through both scan implementations."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest

from gpn_jax.core.gpn import Intervention
from gpn_jax.models.gpn import GPN, GPNConfig
from tests.helpers.window import f32_bound, random_params
from tests.tolerance import assert_rel_close, rel_err

BASE = GPNConfig(vocab_size=37, d_model=16, d_emb=8, d_ffn=20, n_heads=3, d_key=4, d_value=5)
T = 32
X = jax.random.randint(jax.random.PRNGKey(1), (2, T), 0, 37)
BF16_ROUNDING = 2.0**-9  # bfloat16's relative rounding (8 significand bits)


@functools.cache  # shared by the tests below (each result is only read)
def run(scan_impl: str, memory_dtype: str):
    model = GPN(dataclasses.replace(BASE, scan_impl=scan_impl, memory_dtype=memory_dtype))
    params = random_params(model)

    def f(p):
        loss, (carry, _) = model.loss(p, X)
        return loss, carry

    (loss, carry), grads = jax.jit(jax.value_and_grad(f, has_aux=True))(params)
    return model, params, float(loss), carry, grads


@pytest.mark.parametrize("scan_impl", ["autodiff", "fused"])
def test_bfloat16_memory_loss_and_carry(scan_impl):
    model, params, ref, ref_carry, _ = run(scan_impl, "float32")
    bf16_model, _, loss, carry, _ = run(scan_impl, "bfloat16")
    assert bf16_model.init_state(2).M.dtype == carry.M.dtype == jnp.bfloat16
    assert ref_carry.M.dtype == jnp.float32 and carry.s.dtype == jnp.float32
    # bfloat16 storage rounds each write to 2^-9 relative, over T = 32 writes: the memory
    # within T * 2^-9 of float32 storage; the loss moves by at most that share of what the
    # memory is worth (zeroing its read, measured here), far below that worth itself, so
    # storing a wrong value could not pass
    no_read = jax.jit(
        lambda p: model.autodiff().loss(p, X, iv=Intervention(read_scale=jnp.zeros(())))[0]
    )(params)
    worth = abs(float(no_read) - ref) / ref
    assert worth > 1e-3
    assert 0 < abs(loss - ref) / ref < T * BF16_ROUNDING * worth
    assert rel_err(carry.M.astype(jnp.float32), ref_carry.M) < T * BF16_ROUNDING


def test_bfloat16_memory_gradients_fused_vs_autodiff():
    *_, g_auto = run("autodiff", "bfloat16")
    *_, g_fused = run("fused", "bfloat16")
    *_, g_f32 = run("fused", "float32")
    # autodiff carries the memory's cotangent in bfloat16, the fused backward in float32; and
    # bfloat16 against float32 storage: T = 32 steps, each rounding to 2^-9 relative
    bound = T * BF16_ROUNDING
    assert_rel_close(g_fused, g_auto, bound, "fused vs autodiff, bfloat16 memory")
    assert_rel_close(g_fused, g_f32, bound, "bfloat16 vs float32 memory, fused")


def test_memory_dtype_is_checked():
    with pytest.raises(ValueError, match="memory_dtype must be 'float32' or 'bfloat16', got 'f8'"):
        dataclasses.replace(BASE, memory_dtype="f8")


@pytest.mark.parametrize("scan_impl", ["autodiff", "fused"])
def test_bfloat16_memory_with_document_resets_keeps_its_dtype_and_resets(scan_impl):
    """Stateful resets multiply the carry by 0 / 1: the stored memory stays bfloat16, and a
    reset at every position equals the zero-state model position by position."""
    model = GPN(dataclasses.replace(BASE, scan_impl=scan_impl, memory_dtype="bfloat16"))
    params = random_params(model)
    resets = jnp.zeros(X.shape, bool).at[:, 16].set(True)
    losses, carry = jax.jit(lambda p: model.token_losses(p, X, resets=resets))(params)
    assert carry.M.dtype == jnp.bfloat16
    fresh, _ = jax.jit(lambda p: model.token_losses(p, X[:, 16:]))(params)
    # the second half after a reset is the fresh model on it (same float32 math, same bf16
    # storage rounding); a compilation may reorder one contraction (at most the vocabulary)
    assert rel_err(losses[:, 16:], fresh) < f32_bound(37)
