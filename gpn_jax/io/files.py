"""Atomic file writes (safe when several hosts share a directory) and file hashing.

Temporary names are unique per host, process and call (`paths.write_bytes`); on an object
store (`gs://`) one object upload is atomic by itself.
"""

import hashlib

import numpy as np
from etils import epath

from gpn_jax.io import paths
from gpn_jax.io.untrusted import read_npy


def atomic_write(path: str, data: bytes) -> None:
    """Writes `data` to `path` via a uniquely named temporary file and a rename."""
    paths.write_bytes(path, data)


def sha256_file(path) -> str:
    """The sha256 hex digest of the file at `path` (local, `gs://` or an epath), read in blocks."""
    h = hashlib.sha256()
    with epath.Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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
