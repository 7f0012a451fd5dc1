"""Atomic file writes (safe when several hosts share a directory).

Temporary names are unique per host, process and call (`paths.write_bytes`); on an object
store (`gs://`) one object upload is atomic by itself.
"""

import io

import numpy as np

from gpn_jax.io import paths


def atomic_write(path: str, data: bytes) -> None:
    """Writes `data` to `path` via a uniquely named temporary file and a rename."""
    paths.write_bytes(path, data)


def atomic_save_npy(path: str, array: np.ndarray) -> None:
    """Saves `array` as a .npy file at `path` (as `atomic_write`)."""
    with paths.atomic_open(path) as f:
        np.save(f, array, allow_pickle=False)  # read back with allow_pickle=False too


def load_npy(path: str) -> np.ndarray:
    """Reads a .npy file from a local path or a URL."""
    if paths.is_remote(path):
        return np.load(io.BytesIO(paths.read_bytes(path)), allow_pickle=False)
    return np.load(path, allow_pickle=False)
