"""The Pallas memory kernels' TPU (Mosaic) variant (`gpn_jax.kernels.pallas.tpu`): each pass in
Pallas's TPU interpreter (the TPU grid, blocks and scalar prefetch, run on this CPU) against
the reference backend `gpn_jax.kernels.xla` (`tests/helpers/memory_reference.py`), for float32 and bfloat16
storage with document resets, at small shapes that meet Mosaic's tiling (H whole, K a
multiple of 8, U tiles of 128); then the lowering for TPU at the 130M shapes and, where libtpu
is installed, the Mosaic compile for a v5e chip (which rejects blocks over the VMEM limit).

Tolerances are norm-relative (`tests/tolerance.py`), derived as in `test_pallas_memory.py`:
float32 round-off eps32 x n x MARGIN for a reduction of n terms (K for M^T x, U for M y, K U
for <dM, M>; S chained non-expansive writes for the stack); bfloat16 storage adds one bfloat16
step (2^-7 relative) per stored write, S of them for the stack.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpn_jax.benchmarks.aot import targets, tpus
from gpn_jax.kernels.pallas import MEMORY_DTYPES, memory_kernels
from gpn_jax.kernels.pallas import tpu as tpu_kernels
from tests.helpers import memory_reference as ref
from tests.tolerance import assert_rel_close

EPS32 = 1.19e-7
EPS_BF16 = 2.0**-7
MARGIN = 4  # over the linear round-off bound
B, H, K, U, S = 2, 3, 8, 256, 5  # U = two tiles of 128: the partial row sums are exercised


@pytest.fixture(scope="module")
def kernels():
    mk = memory_kernels(interpret=True, platform="tpu")
    cfg = mk.step.args[0]
    assert cfg.platform == "tpu" and cfg.interpret
    assert mk.step.func is tpu_kernels.step  # the Mosaic variant, interpreted
    return mk


def _inputs(seed, lead=()):
    return ref.write_inputs(seed, (B, H, K, U, S), lead)


def _memory(seed, dtype, shape=(B, H, K, U)):
    return jax.random.normal(jax.random.key(seed), shape).astype(dtype)


def _check_read(actual, desired, memory, bound, what):
    """||actual - desired|| <= bound ||memory||: a read of a stored memory (unit query)."""
    err = np.linalg.norm(np.asarray(actual, np.float64) - np.asarray(desired, np.float64))
    scale = np.linalg.norm(np.asarray(memory, np.float64))
    assert err <= bound * scale, f"{what}: {err / scale:.2e} > {bound:.1e}"


@pytest.mark.parametrize("dtype", MEMORY_DTYPES)
def test_step_matches_formulas(kernels, dtype):
    args = (_memory(0, dtype), *_inputs(1))
    Mn, o = jax.jit(kernels.step)(*args)
    Mn_ref, o_ref = ref.step(*args)
    assert Mn.dtype == jnp.dtype(dtype) and o.dtype == jnp.float32 and o.shape == (B, H, U)
    f32 = EPS32 * K * MARGIN  # M^T k over K, then one multiply-add
    store = EPS_BF16 if dtype == "bfloat16" else 0.0
    assert_rel_close(Mn.astype(jnp.float32), Mn_ref.astype(jnp.float32), f32 + store, "M'")
    _check_read(o, o_ref, Mn_ref.astype(jnp.float32), 2 * f32 + store, "o")
    own = jnp.einsum("bhk,bhku->bhu", args[2], Mn.astype(jnp.float32))
    _check_read(o, own, Mn.astype(jnp.float32), f32, "o from the stored M'")


@pytest.mark.parametrize("dtype", MEMORY_DTYPES)
def test_stack_matches_scan_with_resets(kernels, dtype):
    M0 = _memory(2, dtype)
    k, q, v, beta, eg = _inputs(3, lead=(S,))
    keep = jnp.ones((S, B)).at[2, 0].set(0.0).at[0, 1].set(0.0)
    Ms, kM, qM = jax.jit(kernels.stack)(M0, k, q, v, beta, eg, keep)
    Ms_ref, kM_ref, qM_ref = ref.stack(M0, k, q, v, beta, eg, keep)
    assert Ms.dtype == jnp.dtype(dtype) and Ms.shape == (S, B, H, K, U)
    f32 = EPS32 * K * MARGIN * S  # S chained writes, each over K
    store = S * EPS_BF16 if dtype == "bfloat16" else 0.0
    Ms_ref32 = Ms_ref.astype(jnp.float32)
    assert_rel_close(Ms.astype(jnp.float32), Ms_ref32, f32 + store, "Ms")
    np.testing.assert_array_equal(Ms[0], M0)  # the segment's start, stored unchanged
    for name, a, b in (("kM", kM, kM_ref), ("qM", qM, qM_ref)):
        _check_read(a, b, Ms_ref32, f32 + store, name)
    Mi = Ms.astype(jnp.float32) * keep[:, :, None, None, None]
    for name, a, x in (("kM", kM, k), ("qM", qM, q)):
        own = jnp.einsum("sbhk,sbhku->sbhu", x, Mi)
        _check_read(a, own, Mi, EPS32 * K * MARGIN, f"{name} from the stored Ms")
    np.testing.assert_array_equal(kM[0, 1], 0.0)  # row 1 resets at step 0: reads nothing


@pytest.mark.parametrize("dtype", MEMORY_DTYPES)
def test_grad_matches_reference(kernels, dtype):
    # t = 3: the stack's block is chosen by the prefetched t
    ref.check_grad(kernels, dtype, (B, H, K, U, S), 3, EPS32 * MARGIN)


def test_tile_rules_and_refusals():
    cfg = memory_kernels(interpret=False, platform="tpu").step.args[0]
    assert tpu_kernels.tile_u(cfg, 256) == 128 and tpu_kernels.tile_u(cfg, 96) == 96
    for block_u, u in ((64, 256), (384, 256)):
        bad = cfg._replace(block_u=block_u)
        with pytest.raises(ValueError, match="multiple of 128.*kernels='xla'"):
            tpu_kernels.tile_u(bad, u)
    with pytest.raises(ValueError, match="kernels='xla'"):
        memory_kernels(interpret=True, platform="tpu").step(_memory(0, jnp.float16), *_inputs(1))


def _shapes_130m(dtype):
    """The passes' arguments at 130M for one v5e chip: B = 32 rows."""
    return ref.shapes_130m(dtype, 32)


@pytest.mark.parametrize("dtype", MEMORY_DTYPES)
def test_lowers_for_tpu_at_130m(dtype):
    """Each pass is one Mosaic custom call (the backward's `grad` one pass); step and grad
    alias their memory operand (M, dM) to their first result."""
    mk = memory_kernels(platform="tpu")
    assert not mk.step.args[0].interpret
    for name, args in _shapes_130m(jnp.dtype(dtype)).items():
        text = jax.jit(getattr(mk, name)).trace(*args).lower(lowering_platforms=("tpu",)).as_text()
        assert text.count("tpu_custom_call") == 1, name
        assert ("output_operand_aliases" in text) == (name in ("step", "grad")), name


@pytest.mark.parametrize("dtype", MEMORY_DTYPES)
def test_compiles_for_a_v5e_chip_at_130m(dtype):
    """Mosaic's own compile (libtpu, compile-only devices): block layouts it cannot tile and
    blocks over the scoped VMEM limit fail here, not on the chip."""
    missing = tpus.libtpu_missing()
    if missing:
        pytest.skip(f"no libtpu to compile for a TPU: {missing}")
    dev = targets.topology_devices("v5e:2x2")[0]
    sharding = jax.sharding.SingleDeviceSharding(dev)
    mk = memory_kernels(platform="tpu")
    for name, args in _shapes_130m(jnp.dtype(dtype)).items():
        fn = jax.jit(getattr(mk, name), in_shardings=sharding, out_shardings=sharding)
        compiled = fn.trace(*args).lower().compile()
        assert "tpu_custom_call" in compiled.as_text(), name


def test_compiles_inside_a_shard_map_manual_over_the_batch_axes():
    """As `gpn_jax.parallel.spmd` runs the window: manual over the batch axes, the tensor
    axis (one device) left to the partitioner. Mosaic refuses a kernel with any axis left
    automatic, so the kernels map the rest themselves (replicated over one device)."""
    from jax.sharding import PartitionSpec as P

    missing = tpus.libtpu_missing()
    if missing:
        pytest.skip(f"no libtpu to compile for a TPU: {missing}")
    dev = targets.topology_devices("v5e:2x2")[0]
    mesh = jax.sharding.Mesh(np.array([dev]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
    batch = P(("data", "fsdp"))
    step = jax.shard_map(
        memory_kernels(platform="tpu").step,
        mesh=mesh,
        in_specs=batch,
        out_specs=batch,
        axis_names={"data", "fsdp"},
        check_vma=False,
    )
    with jax.set_mesh(mesh):
        compiled = jax.jit(step).trace(*_shapes_130m(jnp.float32)["step"]).lower().compile()
    assert compiled.as_text().count("tpu_custom_call") == 1
