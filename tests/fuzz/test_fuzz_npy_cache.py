"""Fuzzing the `.npy` cache loader (`io.files.load_cache_npy`): a few hundred generated
malformed caches (truncations, byte flips, random bytes, forged headers with hostile dtypes
and huge shapes). Each either loads as exactly the array its bytes hold or raises the one-line
`BadFileError` naming the file; only the file itself is opened, and nothing is allocated
beyond its own size (plus a fixed slack for the parser)."""

import io
import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpn_jax.io.files import load_cache_npy
from gpn_jax.io.untrusted import BadFileError
from tests.fuzz.fuzzing import assert_inside, damaged, peak_allocation, recorded_opens

SLACK = 64 << 10  # header parsing and small Python objects: bounded, independent of the file


def _good() -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.arange(100, dtype=np.uint32), allow_pickle=False)
    return buf.getvalue()


GOOD = _good()
DESCRS = [
    "<u4",
    "<f8",
    "|O",
    ">u4",
    "<i8",
    "|V8",
    "<U4",
    "(1000000000,)<u4",
    "[('a', '<u4')]",
    "u4",
]


@st.composite
def forged(draw) -> bytes:
    """A well-framed .npy whose header dict is hostile: dtype, shape, order or extra keys."""
    descr = draw(st.sampled_from(DESCRS) | st.text(max_size=12))
    shape = draw(
        st.tuples(st.integers(-5, 2**62)) | st.tuples(st.integers(0, 2**31), st.integers(0, 2**31))
        | st.sampled_from(["()", "None", "'x'", "(1,) * 3", "[100]", "(True,)"])
    )  # fmt: skip
    order = draw(st.sampled_from(["False", "True", "None", "1"]))
    extra = draw(st.sampled_from(["", "'x': 1, "]))
    text = f"{{'descr': {descr!r}, 'fortran_order': {order}, 'shape': {shape}, {extra}}}"
    text = text.ljust(draw(st.integers(0, 300)))
    header = text.encode("latin1", "replace")
    version = draw(st.sampled_from([1, 2]))
    size = len(header).to_bytes(2 if version == 1 else 4, "little")
    return b"\x93NUMPY" + bytes([version, 0]) + size + header + draw(st.binary(max_size=64))


def check(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "train-0123.npy")
        with open(path, "wb") as f:
            f.write(content)
        with recorded_opens() as opened, peak_allocation() as peak:
            try:
                array = load_cache_npy(path, "uint32")
            except BadFileError as e:
                msg = str(e)
                assert msg.startswith(path + ": ") and "\n" not in msg
                assert "delete this cache file" in msg
                array = None
        assert_inside(opened, d)
        assert peak[0] <= len(content) + SLACK, (peak[0], len(content))
        if array is not None:  # accepted: exactly the bytes after the header, as uint32
            assert array.dtype == np.uint32 and array.ndim == 1
            assert array.tobytes() == content[len(content) - array.nbytes :]


FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MORE = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(damaged(GOOD))
def test_damaged_cache(content):
    check(content)


@FAST
@given(forged())
def test_forged_header(content):
    check(content)


def test_the_good_cache_loads():
    check(GOOD)


@pytest.mark.slow
@MORE
@given(damaged(GOOD) | forged())
def test_many_malformed_caches(content):
    check(content)
