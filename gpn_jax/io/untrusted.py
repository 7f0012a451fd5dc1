"""Reading files the project did not just write: every one is untrusted input.

A manifest, a `.npy` cache or a tokenizer may be truncated, bit-flipped, hand-edited or
planted. The helpers here check a file against what the reader expects *before* anything
is allocated or parsed by a library, and name the file and the fix in one line
(`BadFileError`, a ValueError, so every entry point prints it as `prog: error: ...` and
exits 1):

* `inside(directory, name, ...)`: a file name read from a file, resolved and refused if it
  leaves `directory` (absolute, `..`, a symlink pointing out).
* `read_json(path, ...)`: a JSON document of bounded size and depth, UTF-8.
* `read_npy(path, ...)`: a `.npy` array whose header (dtype from an allow-list, shape) is
  checked against the file's size before its data is read; nothing is unpickled.
"""

import ast
import io
import json
import os

import numpy as np

from gpn_jax.io import paths

MAX_JSON_BYTES = 64 << 20  # a manifest or config of this project is a few KiB
_MAX_NPY_HEADER = 4096  # numpy writes <= 128 bytes for a 1-D array


class BadFileError(ValueError):
    """A file the project read is malformed, hostile, or inconsistent with its neighbours."""


def bad_file(path, what: str, fix: str) -> BadFileError:
    """The one-line error for `path`: what is wrong with it and what to do."""
    return BadFileError(f"{os.fspath(path)}: {what}; {fix}".replace("\n", " "))


def inside(directory, name, *, source, field: str) -> str:
    """`directory/name` resolved (symlinks followed), or BadFileError if `name` (the value of
    `field` in the file `source`) is not a plain relative name that stays in `directory`."""
    fix = f"rewrite {field} as a file name relative to {os.fspath(directory)}"
    if not isinstance(name, str) or not name or "\0" in name:
        raise bad_file(source, f"{field} must be a non-empty file name, got {name!r:.80}", fix)
    parts = name.replace("\\", "/").split("/")
    if os.path.isabs(name) or name.startswith("~") or ".." in parts:
        raise bad_file(source, f"{field} {name!r:.200} leaves the directory", fix)
    root = os.path.realpath(directory)
    full = os.path.realpath(os.path.join(root, name))
    if os.path.commonpath([root, full]) != root:
        raise bad_file(source, f"{field} {name!r:.200} is a link that leaves the directory", fix)
    return full


def read_json(path, *, fix: str, max_bytes: int = MAX_JSON_BYTES):
    """The JSON value in `path`; BadFileError (naming `fix`) if it is too large, not UTF-8,
    not JSON, or nested absurdly deep."""
    if not os.path.isfile(path):
        raise bad_file(path, "not a regular file", fix)
    size = os.path.getsize(path)
    if size > max_bytes:
        raise bad_file(path, f"{size} bytes, more than the {max_bytes} a JSON file may hold", fix)
    with open(path, "rb") as f:
        raw = f.read(size + 1)  # the file's own size: `read(n)` allocates n bytes up front
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # RecursionError: absurdly deep nesting
        raise bad_file(path, f"not valid JSON ({str(e).splitlines()[0][:120]})", fix) from None


def _npy_header(f, path, fix: str):
    """(shape, dtype, data offset) of the .npy stream `f`, never unpickling anything."""
    try:
        major, _ = np.lib.format.read_magic(f)
        if major not in (1, 2, 3):
            raise ValueError(f"unknown .npy version {major}")
        length_bytes = 2 if major == 1 else 4
        raw = f.read(length_bytes)
        if len(raw) != length_bytes:
            raise ValueError("truncated header")
        length = int.from_bytes(raw, "little")
        if length > _MAX_NPY_HEADER:
            raise ValueError(f"header of {length} bytes")
        header = f.read(length)
        if len(header) != length:
            raise ValueError("truncated header")
        d = ast.literal_eval(header.decode("latin1"))  # literals only: nothing is executed
        if not isinstance(d, dict) or set(d) != {"descr", "fortran_order", "shape"}:
            raise ValueError("header is not {descr, fortran_order, shape}")
        descr, shape = d["descr"], d["shape"]
        if not isinstance(descr, str):
            raise ValueError(f"dtype {descr!r:.60} is not a plain dtype")
        if not isinstance(shape, tuple) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
        ):
            raise ValueError(f"shape {shape!r:.60} is not a tuple of sizes")
        return shape, np.dtype(descr), f.tell()
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, UnicodeError) as e:
        msg = (str(e).splitlines() or [type(e).__name__])[0][:120]
        raise bad_file(path, f"not a valid .npy array ({msg})", fix) from None


def read_npy(path, *, dtypes: tuple[str, ...], ndim: int, fix: str) -> np.ndarray:
    """The array in the `.npy` file `path`, checked before its data is read: dtype one of
    `dtypes`, `ndim` dimensions, and shape x itemsize exactly the bytes after the header.
    Local paths and URLs (read whole: caches are the size of their token stream)."""
    if paths.is_remote(path):
        blob = paths.read_bytes(path)
        f, size = io.BytesIO(blob), len(blob)
    else:
        if not os.path.isfile(path):
            raise bad_file(path, "not a regular file", fix)
        f, size = open(path, "rb"), os.path.getsize(path)  # noqa: SIM115 - closed below
    with f:
        shape, dtype, offset = _npy_header(f, path, fix)
        if dtype.name not in dtypes or dtype.byteorder == ">":
            raise bad_file(path, f"dtype {dtype.str} is not one of {', '.join(dtypes)}", fix)
        if len(shape) != ndim:
            raise bad_file(path, f"shape {shape} is not {ndim}-dimensional", fix)
        count = 1
        for n in shape:
            count *= n
        if count * dtype.itemsize != size - offset:
            raise bad_file(
                path,
                f"header says {shape} {dtype.name} ({count * dtype.itemsize} bytes) but "
                f"{size - offset} bytes follow it",
                fix,
            )
        out = np.empty(shape, dtype)
        got = f.readinto(memoryview(out.reshape(-1).view(np.uint8))) if count else 0
    if got != count * dtype.itemsize:
        raise bad_file(path, "file shrank while being read", fix)
    return out
