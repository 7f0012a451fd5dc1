"""Atomic file writes (safe when several hosts share a directory).

Temporary names are unique per host, process and call (`paths.write_bytes`); on an object
store (`gs://`) one object upload is atomic by itself.
"""

import numpy as np

from gpn_jax.io import paths
from gpn_jax.io.untrusted import read_npy


def atomic_write(path: str, data: bytes) -> None:
    """Writes `data` to `path` via a uniquely named temporary file and a rename."""
    paths.write_bytes(path, data)


def atomic_save_npy(path: str, array: np.ndarray) -> None:
    """Saves `array` as a .npy file at `path` (as `atomic_write`)."""
    with paths.atomic_open(path) as f:
        np.save(f, array, allow_pickle=False)  # read back with allow_pickle=False too


def load_cache_npy(path: str, dtype: str) -> np.ndarray:
    """A 1-D `dtype` array cached by `atomic_save_npy` (a local path or a URL).

    Untrusted: the header's dtype and shape are checked against the file's size before the
    data is read, and nothing is unpickled; a bad file is one line naming it for deletion.
    """
    return read_npy(
        path, dtypes=(dtype,), ndim=1, fix="delete this cache file (it is rebuilt on the next run)"
    )
