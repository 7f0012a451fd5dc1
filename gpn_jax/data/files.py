"""Atomic file writes (safe when several hosts share a directory)."""

import os

import numpy as np


def _tmp_path(path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return f"{path}.tmp{os.getpid()}"


def atomic_write(path: str, data: bytes) -> None:
    """Writes `data` to `path` via a temporary file and a rename."""
    tmp = _tmp_path(path)
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def atomic_save_npy(path: str, array: np.ndarray) -> None:
    """Saves `array` as a .npy file at `path` via a temporary file and a rename."""
    tmp = _tmp_path(path)
    with open(tmp, "wb") as f:
        np.save(f, array, allow_pickle=False)  # read back with allow_pickle=False too
    os.replace(tmp, path)
