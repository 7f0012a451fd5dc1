"""Helpers (not tests) shared by the loader fuzz tests: generated damage to a file's bytes,
a record of every file a loader opens, and its peak Python-side allocation."""

import builtins
import contextlib
import io
import os
import tracemalloc

from hypothesis import strategies as st

# A few names meant to leave a directory: absolute, `..`, home, NUL, backslashes, long.
TRAVERSAL_NAMES = [
    "/etc/passwd",
    "../outside.bin",
    "train/../../outside.bin",
    "~/outside.bin",
    "..",
    "",
    "train/\x00.bin",
    "..\\outside.bin",
    "/",
    "a" * 5000,
]


@st.composite
def damaged(draw, good: bytes) -> bytes:
    """`good` truncated, with bytes flipped or inserted, or replaced by random bytes."""
    kind = draw(st.sampled_from(["truncate", "flip", "insert", "random"]))
    data = bytearray(good)
    if kind == "truncate":
        return bytes(data[: draw(st.integers(0, max(len(data) - 1, 0)))])
    if kind == "random":
        return draw(st.binary(max_size=2 * len(good) + 16))
    for _ in range(draw(st.integers(1, 8))):
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] ^= draw(st.integers(1, 255))
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
    return bytes(data)


def json_values():
    """Any JSON value (wrong types for a field): null, bools, huge / negative numbers, strings,
    nested lists and objects."""
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(-(2**70), 2**70)
        | st.floats(allow_nan=False)
        | st.text(max_size=20)
        | st.sampled_from(TRAVERSAL_NAMES)
    )
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
        ),
        max_leaves=8,
    )


@contextlib.contextmanager
def recorded_opens():
    """Yields the list of (real) paths that `open` / `io.open` / `os.open` were called with."""
    seen = []
    real_open, real_io_open, real_os_open = builtins.open, io.open, os.open

    def note(file):
        if isinstance(file, (str, bytes, os.PathLike)):
            seen.append(os.path.realpath(os.fsdecode(file)))

    def patched_open(file, *a, **k):
        note(file)
        return real_open(file, *a, **k)

    def patched_os_open(path, *a, **k):
        note(path)
        return real_os_open(path, *a, **k)

    builtins.open, io.open, os.open = patched_open, patched_open, patched_os_open
    try:
        yield seen
    finally:
        builtins.open, io.open, os.open = real_open, real_io_open, real_os_open


def assert_inside(paths, directory) -> None:
    root = os.path.realpath(directory)
    for p in paths:
        assert os.path.commonpath([root, p]) == root, f"read outside {root}: {p}"


@contextlib.contextmanager
def peak_allocation():
    """Yields a one-item list that holds, afterwards, the peak bytes traced while inside
    (Python objects and numpy buffers; both report to tracemalloc)."""
    out = [0]
    tracemalloc.start()
    try:
        yield out
    finally:
        out[0] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
