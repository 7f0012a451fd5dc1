"""What the Pallas memory kernels' GPU / CPU-interpreter variant (`gpu`) and TPU variant
(`tpu`) share: the build configuration, the storage dtypes and the per-tile products."""

from typing import NamedTuple

import jax.numpy as jnp

F32 = jnp.float32
MEMORY_DTYPES = ("float32", "bfloat16")
XLA_HINT = "use model.kernels='xla'"


class Config(NamedTuple):
    """How the kernels are built: `interpret` (Pallas's interpreter, any platform), the target
    `platform` ('cpu', 'cuda', 'rocm' or 'tpu'), the U tile `block_u` (None: each variant's
    default) and the Triton warps per program."""

    interpret: bool
    platform: str
    block_u: int | None = None
    num_warps: int = 8


def col_sum(x, M):
    """x^T M over the tile's rows: (..., K), (..., K, bu) -> (..., bu)."""
    return jnp.sum(x[..., :, None] * M, axis=-2)


def row_sum(M, y):
    """M y over the tile's columns, this tile's part: (..., K, bu), (..., bu) -> (..., K)."""
    return jnp.sum(M * y[..., None, :], axis=-1)


def outer(x, y):
    """x y^T per leading index: (..., K), (..., bu) -> (..., K, bu)."""
    return x[..., :, None] * y[..., None, :]
