"""The Pallas memory kernels (interpret mode on this CPU, with the CPU's blocks and with the
GPU's grid of (b, h, U tile) programs) against the reference backend `gpn_jax.kernels.xla`
(`tests/helpers/memory_reference.py`), for float32 and bfloat16 storage with document resets,
per shard under `shard_map`, and their Triton lowering for CUDA at the 130M shapes (jaxlib
carries the Triton dialect, so this needs no GPU and no CUDA plugin). The TPU variant has its
own tests (`test_pallas_tpu.py`).

Tolerances are norm-relative (`tests/tolerance.py`):
- float32 arithmetic: a sum of n products in another order differs by at most ~n eps32 relative
  to the sum of magnitudes, so each output's bound is eps32 x n x MARGIN, n its reduction length
  (K for M^T x, U for M y, K U for <dM, M>, K + U for M (-beta (dM^T k + dw))), and the stack's S chained writes add theirs (each
  write, (eg I - beta k k^T) Mi + beta k v^T with |k| = 1, eg <= 1, beta < 1, is non-expansive);
- bfloat16 storage: kernel and reference round the same float32 values, which may differ in the
  last bits, so a stored value may land one bfloat16 step (eps_bf16 = 2^-7 relative) apart:
  M' within eps_bf16, a stack of S steps within S eps_bf16 (non-expansive writes carry earlier
  steps' differences unchanged at most), and reads of a stored memory within the same bound
  relative to the memory's norm (|q| = 1: ||dM^T q|| <= ||dM||).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpn_jax.kernels.pallas import MEMORY_DTYPES, memory_kernels
from tests.helpers import memory_reference as ref
from tests.tolerance import assert_rel_close

EPS32 = 1.19e-7
EPS_BF16 = 2.0**-7  # 7.8e-3: one bfloat16 step per stored value
MARGIN = 4  # over the linear round-off bound
B, H, K, U, S = 2, 3, 8, 16, 5
BLOCK_U = 8  # two U tiles: the kernels' partial row sums are exercised


@pytest.fixture(scope="module", params=["cpu", "cuda"])
def kernels(request):
    """Interpreted as the CPU runs them (one program over every (b, h); the stack sliced at t
    before the grads) and as a GPU's grid runs them (one program per (b, h, U tile); the grads
    index the stack at t themselves)."""
    return memory_kernels(interpret=True, platform=request.param, block_u=BLOCK_U)


def _inputs(seed, lead=()):
    return ref.write_inputs(seed, (B, H, K, U, S), lead)


def _memory(seed, dtype, shape=(B, H, K, U)):
    return jax.random.normal(jax.random.key(seed), shape).astype(dtype)


def _keep():
    """(S, B) resets: row 0 starts a document at step 2, row 1 at step 0."""
    return jnp.ones((S, B)).at[2, 0].set(0.0).at[0, 1].set(0.0)


def _check_read(actual, desired, memory, bound, what):
    """||actual - desired|| <= bound ||memory||: a read of a stored memory (unit query)."""
    err = np.linalg.norm(np.asarray(actual, np.float64) - np.asarray(desired, np.float64))
    scale = np.linalg.norm(np.asarray(memory, np.float64))
    assert err <= bound * scale, f"{what}: {err / scale:.2e} > {bound:.1e}"


@pytest.mark.parametrize("dtype", MEMORY_DTYPES)
def test_step_matches_formulas(kernels, dtype):
    M = _memory(0, dtype)
    args = (M, *_inputs(1)[:2], *_inputs(1)[2:])
    Mn, o = jax.jit(kernels.step)(*args)
    Mn_ref, o_ref = ref.step(*args)
    assert Mn.dtype == jnp.dtype(dtype) and o.dtype == jnp.float32
    f32 = EPS32 * K * MARGIN  # M^T k over K, then one multiply-add
    store = EPS_BF16 if dtype == "bfloat16" else 0.0
    assert_rel_close(Mn.astype(jnp.float32), Mn_ref.astype(jnp.float32), f32 + store, "M'")
    _check_read(o, o_ref, Mn_ref.astype(jnp.float32), 2 * f32 + store, "o")
    # the read is of the stored M' (float32 round-off only from the kernel's own M')
    own = jnp.einsum("bhk,bhku->bhu", args[2], Mn.astype(jnp.float32))
    _check_read(o, own, Mn.astype(jnp.float32), f32, "o from the stored M'")


@pytest.mark.parametrize("dtype", MEMORY_DTYPES)
def test_stack_matches_scan_with_resets(kernels, dtype):
    M0 = _memory(2, dtype)
    k, q, v, beta, eg = _inputs(3, lead=(S,))
    Ms, kM, qM = jax.jit(kernels.stack)(M0, k, q, v, beta, eg, _keep())
    Ms_ref, kM_ref, qM_ref = ref.stack(M0, k, q, v, beta, eg, _keep())
    assert Ms.dtype == jnp.dtype(dtype) and Ms.shape == (S, B, H, K, U)
    f32 = EPS32 * K * MARGIN * S  # S chained writes, each over K
    store = S * EPS_BF16 if dtype == "bfloat16" else 0.0
    Ms_ref32 = Ms_ref.astype(jnp.float32)
    assert_rel_close(Ms.astype(jnp.float32), Ms_ref32, f32 + store, "Ms")
    np.testing.assert_array_equal(Ms[0], M0)  # the segment's start, stored unchanged
    for name, a, b in (("kM", kM, kM_ref), ("qM", qM, qM_ref)):
        _check_read(a, b, Ms_ref32, f32 + store, name)
    # each step reads the memory as stored (the carry is rounded to storage at every write)
    Mi = Ms.astype(jnp.float32) * _keep()[:, :, None, None, None]
    for name, a, x in (("kM", kM, k), ("qM", qM, q)):
        own = jnp.einsum("sbhk,sbhku->sbhu", x, Mi)
        _check_read(a, own, Mi, EPS32 * K * MARGIN, f"{name} from the stored Ms")
    # a reset zeroes the memory that step reads: row 1's step 0 reads nothing
    np.testing.assert_array_equal(kM[0, 1], 0.0)


@pytest.mark.parametrize("dtype", MEMORY_DTYPES)
@pytest.mark.parametrize("t", [1, 3])
def test_grad_matches_reference(kernels, dtype, t):
    ref.check_grad(kernels, dtype, (B, H, K, U, S), t, EPS32 * MARGIN)


def test_default_tile_and_interpret_choice():
    """interpret=None on this CPU: the interpreter, with the default U tile (one tile here)."""
    mk = memory_kernels()
    cfg = mk.step.args[0]
    assert mk.name == "pallas" and cfg.interpret and cfg.platform == "cpu"
    M = _memory(12, jnp.float32)
    args = (M, *_inputs(13))
    Mn, o = jax.jit(mk.step)(*args)
    Mn_ref, o_ref = ref.step(*args)
    assert_rel_close((Mn, o), (Mn_ref, o_ref), EPS32 * K * MARGIN * 2, "step")


def test_refusals_name_the_xla_alternative():
    with pytest.raises(ValueError, match="kernels='xla'"):
        memory_kernels(interpret=True).step(_memory(0, jnp.float16), *_inputs(1))
    with pytest.raises(ValueError, match="kernels='xla'"):
        memory_kernels(interpret=True, block_u=5).step(_memory(0, jnp.float32), *_inputs(1))
    with pytest.raises(ValueError, match="compile for GPU or TPU, not 'cpu'.*kernels='xla'"):
        memory_kernels(interpret=False, platform="cpu")
    with pytest.raises(ValueError, match="power-of-two"):
        gpu = memory_kernels(interpret=False, platform="cuda", block_u=16)
        jax.jit(gpu.step).trace(_memory(0, jnp.float32, (B, H, 6, U)), *_inputs(1)).lower(
            lowering_platforms=("cuda",)
        )


def _on_h100():
    """Lowering for a GPU from this CPU host: jax 0.11's Triton lowering reads the target GPU
    from the abstract mesh's device (0.10 assumed one); an H100, as the device runs."""
    device = jax.sharding.AbstractDevice("NVIDIA H100", None, "gpu")
    return jax.sharding.use_abstract_mesh(
        jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
    )


@pytest.mark.parametrize("dtype", MEMORY_DTYPES)
def test_lowers_for_cuda_at_130m(dtype):
    """Triton lowering from this CPU host (jaxlib carries the Triton dialect; PTX is compiled on
    the GPU): each pass becomes one Triton custom call (the backward's `grad` one pass); step
    and grad alias their memory operand to their first result."""
    mk = memory_kernels(interpret=False, platform="cuda")
    for name, args in ref.shapes_130m(jnp.dtype(dtype), 8).items():
        with _on_h100():
            lowered = jax.jit(getattr(mk, name)).trace(*args).lower(lowering_platforms=("cuda",))
        text = lowered.as_text()
        assert text.count("xla.gpu.triton") == 1, name
        # one program per (b, h, U tile of 64): grid (8, 15, 4), 8 warps each
        for attr in ("grid_x = 8 ", "grid_y = 15 ", "grid_z = 4 ", "num_warps = 8 "):
            assert attr in text, (name, attr)
        if name in ("step", "grad"):
            assert "output_operand_aliases" in text, name


def test_step_and_grad_per_shard(kernels):
    """Under `shard_map` with the batch split over two devices (how the fused window runs them
    per shard, `check_vma=False` as `gpn_jax.parallel.spmd` maps) each shard's kernels give the
    unsharded result: the passes are per (b, h)."""
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    M = _memory(14, jnp.float32)
    args = (M, *_inputs(15))
    spec = (P("data"),) * len(args)
    sharded = jax.jit(
        jax.shard_map(kernels.step, mesh=mesh, in_specs=spec, out_specs=P("data"), check_vma=False)
    )
    bound = EPS32 * K * MARGIN * 2  # same formulas; only the summation order may differ
    assert_rel_close(sharded(*args), jax.jit(kernels.step)(*args), bound, "step per shard")
    Ms, _, *rest = ref.grad_args(jnp.float32, (B, H, K, U, S), 3, jnp.array([1.0, 0.0]))
    per_shard = jax.shard_map(
        lambda Ms, *r: kernels.grad(Ms, 3, *r),
        mesh=mesh,
        in_specs=(P(None, "data"),) + (P("data"),) * len(rest),
        out_specs=P("data"),
        check_vma=False,
    )
    want = jax.jit(kernels.grad)(Ms, 3, *rest)
    assert_rel_close(
        jax.jit(per_shard)(Ms, *rest), want, EPS32 * (K + U) * MARGIN, "grad per shard"
    )
