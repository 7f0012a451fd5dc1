"""Pre-tokenised flat .bin shards (raw uint16/uint32 tokens, no header), memory-mapped.

A directory is read in sorted shard order as one virtual token array; `data_*.bin` files
are used if present (the paper's layout: `data_0000.bin`, ... uint32), else every `*.bin`.
"""

import glob
import os

import numpy as np

BIN_DTYPES = ("uint16", "uint32")


def list_shards(path: str) -> list[str]:
    """The shard files of `path` (a file, or a directory of .bin files), sorted."""
    if not os.path.exists(path):
        raise ValueError(f"data path not found: {path}")
    if os.path.isfile(path):
        return [path]
    shards = sorted(glob.glob(os.path.join(path, "data_*.bin"))) or sorted(
        glob.glob(os.path.join(path, "*.bin"))
    )
    if not shards:
        raise ValueError(f"no .bin shards in directory {path}")
    return shards


def memmap_shard(path: str, dtype: np.dtype) -> np.ndarray:
    """One shard file as a read-only memory-mapped token array."""
    size = os.path.getsize(path)
    if size % dtype.itemsize:
        raise ValueError(f"{path}: size {size} bytes is not a multiple of {dtype.name} tokens")
    if size == 0:
        return np.zeros((0,), dtype)
    # Safe on any file: raw integers, read-only; no header or code is interpreted.
    return np.memmap(path, dtype=dtype, mode="r")


class ShardedTokens:
    """A read-only, sliceable view of the concatenation of several 1-D token arrays."""

    def __init__(self, arrays: list, start: int = 0, stop: int | None = None):
        self._arrays = arrays
        self._ends = np.cumsum([len(a) for a in arrays], dtype=np.int64)
        total = int(self._ends[-1]) if arrays else 0
        self.start, self.stop = start, total if stop is None else stop
        self.dtype = arrays[0].dtype if arrays else np.dtype(np.uint32)

    def __len__(self) -> int:
        return self.stop - self.start

    def view(self, start: int, stop: int) -> "ShardedTokens":
        """Tokens [start, stop) of this view, without reading them."""
        return ShardedTokens(self._arrays, self.start + start, self.start + stop)

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("ShardedTokens supports contiguous slices only")
        lo, hi, _ = key.indices(len(self))
        return self._read(self.start + lo, self.start + max(lo, hi))

    def _read(self, lo: int, hi: int) -> np.ndarray:
        parts, first = [], int(np.searchsorted(self._ends, lo, side="right"))
        for i in range(first, len(self._arrays)):
            begin = int(self._ends[i - 1]) if i else 0
            if begin >= hi:
                break
            parts.append(np.asarray(self._arrays[i][max(lo, begin) - begin : hi - begin]))
        return np.concatenate(parts) if parts else np.zeros((0,), self.dtype)


def open_bin(path: str, dtype: str = "uint32") -> ShardedTokens:
    """Memory-maps the shards of `path` (see `list_shards`) as one token sequence."""
    if dtype not in BIN_DTYPES:
        raise ValueError(f"bin_dtype must be one of {BIN_DTYPES}, got {dtype!r}")
    return ShardedTokens([memmap_shard(p, np.dtype(dtype)) for p in list_shards(path)])
