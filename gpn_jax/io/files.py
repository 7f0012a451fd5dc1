"""Atomic file writes (safe when several hosts share a directory) and file hashing.

Temporary names are unique per host, process and call (`paths.write_bytes`); on an object
store (`gs://`) one object upload is atomic by itself.
"""

import contextlib
import hashlib
import os
import tempfile

import numpy as np
from etils import epath

from gpn_jax.io import paths
from gpn_jax.io.regular import naming, open_regular
from gpn_jax.io.untrusted import bad_file, read_npy

DIGEST_SUFFIX = ".sha256"  # `<cache>.npy.sha256`: the sha256 of the cached array's bytes
_CACHE_FIX = "delete this cache file (it is rebuilt on the next run)"


def atomic_write(path: str, data: bytes, *, private: bool = False) -> None:
    """Writes `data` to `path` via a uniquely named temporary file and a rename. `private`
    (local paths): the file is readable and writable by its owner only, whatever the umask."""
    if not private:
        paths.write_bytes(path, data)
        return
    with naming(path), atomic_output(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


@contextlib.contextmanager
def atomic_output(path, suffix: str = ".tmp"):
    """A private (0600) temporary file beside the local `path`, for the block (or a tool it
    runs, e.g. a compiler's `-o`) to write: renamed over `path` when the block succeeds, removed
    when it fails, so `path` holds the old or the new content, never a part."""
    fd, tmp = tempfile.mkstemp(suffix=suffix, dir=os.path.dirname(os.path.abspath(path)))
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def sha256_file(path) -> str:
    """The sha256 hex digest of the file at `path` (local, `gs://` or an epath), read in blocks."""
    h = hashlib.sha256()
    if paths.is_remote(path):
        f = epath.Path(path).open("rb")
    else:  # a regular file only: a FIFO would block, a device never end
        f, _ = open_regular(str(path))
    with f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def atomic_save_npy(path: str, array: np.ndarray) -> None:
    """Saves `array` as a .npy file at `path` (as `atomic_write`), its data written by Python:
    numpy's own write of a file (`tofile`) reports a failure without its errno."""
    array = np.ascontiguousarray(array)
    with paths.atomic_open(path) as f:
        np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(array))
        f.write(memoryview(array).cast("B"))  # read back with allow_pickle=False


def load_cache_npy(path: str, dtype: str) -> np.ndarray:
    """A 1-D `dtype` array cached by `atomic_save_npy` (a local path or a URL).

    Untrusted: the header's dtype and shape are checked against the file's size before the
    data is read, and nothing is unpickled; a bad file is one line naming it for deletion.
    """
    return read_npy(
        path, dtypes=(dtype,), ndim=1, fix="delete this cache file (it is rebuilt on the next run)"
    )


def save_cache(path: str, array: np.ndarray) -> None:
    """`atomic_save_npy`, then the array's sha256 in `<path>.sha256` (written second, so a
    digest always describes a whole file)."""
    atomic_save_npy(path, array)
    paths.write_bytes(path + DIGEST_SUFFIX, (_sha256(array) + "\n").encode())


def load_cache(path: str, dtype: str, check=None) -> np.ndarray | None:
    """The array cached at `path` by `save_cache`, verified by content; None if there is none
    to use (no file, or no digest: a cache from before digests or a write killed between the
    two files; the caller rebuilds it). `check(array)` (e.g. an id range) runs before the
    digest is compared, so its error names the problem; a mismatch is one BadFileError line."""
    if not paths.exists(path):
        return None
    array = load_cache_npy(path, dtype)
    if check is not None:
        check(array)
    side = path + DIGEST_SUFFIX
    if not paths.exists(side):
        return None
    if _read_digest(side) != _sha256(array):
        raise bad_file(
            path, f"its content is not what was written (sha256 recorded in {side})", _CACHE_FIX
        )
    return array


def _sha256(array: np.ndarray) -> str:
    return hashlib.sha256(memoryview(np.ascontiguousarray(array)).cast("B")).hexdigest()


def _read_digest(side: str) -> str:
    """The hex digest in a sidecar (untrusted: at most 128 bytes of ASCII hex)."""
    if not paths.is_remote(side) and not os.path.isfile(side):
        raise bad_file(side, "not a regular file", _CACHE_FIX)
    if not paths.is_remote(side) and os.path.getsize(side) > 128:
        raise bad_file(side, "not a sha256 digest", _CACHE_FIX)
    text = paths.read_bytes(side)[:129].decode("ascii", "replace").strip()
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise bad_file(side, "not a sha256 digest", _CACHE_FIX)
    return text
