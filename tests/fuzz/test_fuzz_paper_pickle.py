"""Fuzz: the paper checkpoint pickle reader (`checkpoints.paper_pickle.load`).

Generated malformed pickles (truncations, byte flips, spliced opcodes, wrong types in the
dict, allocation requests) must each give a loaded checkpoint of the right layout or one
`ValueError` line naming the file; nothing outside the directory is opened and the peak
allocation stays within a small multiple of the file's size.
"""

import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpn_jax.checkpoints import paper_pickle
from tests.helpers.fuzz import one_line, watch

GOOD = {
    "step": 3,
    "data_position": 6,
    "params": {"embedding": np.arange(8, dtype=np.float32).reshape(4, 2)},
    "opt_state": ({"embedding": np.zeros((4, 2), np.float32)},),
}
BASES = [pickle.dumps(GOOD, protocol=p) for p in (2, 3, 4, 5)]
# Opcodes that allocate or reach code when given hostile arguments.
SPLICES = [b"\x80\x05", b"c__builtin__\neval\n", b"cbuiltins\nbytearray\n", b"\x95\xff\xff\xff\xff\xff\xff\xff\x7f",
           b"r\xff\xff\xff\x7f", b"j\xff\xff\xff\x0f", b"\x8a\x08" + b"\xff" * 8, b"B\xff\xff\xff\x7f",
           b"\x82\x01", b"Q", b"\x97", b"(", b"t", b"R", b"b", b".", b"\x8c\x05numpy\x8c\x07ndarray\x93"]  # fmt: skip
# Python objects pickled in place of one field of a good checkpoint.
ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8), st.binary(max_size=8),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.integers(), st.integers(), max_size=2),
    st.just(np.zeros(3, np.complex64)), st.just(np.array(["a"])), st.just(set()),
)  # fmt: skip


@st.composite
def malformed(draw) -> bytes:
    how = draw(st.sampled_from(["truncate", "flip", "splice", "field", "top"]))
    data = bytearray(draw(st.sampled_from(BASES)))
    if how == "truncate":
        return bytes(data[: draw(st.integers(0, len(data) - 1))])
    if how == "flip":
        for _ in range(draw(st.integers(1, 4))):
            pos = draw(st.integers(0, len(data) - 1))
            data[pos] = draw(st.integers(0, 255))
        return bytes(data)
    if how == "splice":
        pos = draw(st.integers(0, len(data)))
        return bytes(data[:pos] + draw(st.sampled_from(SPLICES)) + data[pos:])
    if how == "field":
        key = draw(st.sampled_from([*GOOD, 7]))
        ckpt = dict(GOOD) | {key: draw(ODD_VALUES)}
        return pickle.dumps(ckpt, protocol=draw(st.integers(2, 5)))
    return pickle.dumps(draw(ODD_VALUES), protocol=draw(st.integers(2, 5)))


def _check(tmp_path, data: bytes) -> None:
    folder = tmp_path / "run"
    folder.mkdir(exist_ok=True)
    path = folder / "checkpoint.pkl"
    path.write_bytes(data)
    with watch() as w:
        try:
            got = paper_pickle.load(str(folder))
        except ValueError as e:
            one_line(e, str(path))
        else:
            assert isinstance(got["step"], int) and isinstance(got["data_position"], int)
            assert isinstance(got["params"], dict)
    assert not w.outside(str(folder)), w.outside(str(folder))
    # Objects built from n bytes: a few times n for Python's own structures, never more.
    assert w.peak <= 64 * len(data) + (4 << 20), (w.peak, len(data))


SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@settings(max_examples=300, **SETTINGS)
@given(data=malformed())
def test_fuzz_paper_pickle(tmp_path, data):
    _check(tmp_path, data)


@pytest.mark.slow
@settings(max_examples=1000, **SETTINGS)
@given(data=malformed())
def test_fuzz_paper_pickle_many(tmp_path, data):
    _check(tmp_path, data)


def test_the_good_pickle_loads(tmp_path):
    """The fuzz's base files are valid: every malformation starts from a loadable file."""
    for data in BASES:
        (tmp_path / "checkpoint.pkl").write_bytes(data)
        got = paper_pickle.load(str(tmp_path))
        np.testing.assert_array_equal(got["params"]["embed"], GOOD["params"]["embedding"])
