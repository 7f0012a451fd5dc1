"""Fuzz: exported model directories (`checkpoints.model_dir`): config.json and model.safetensors.

Generated malformed files (wrong JSON types, truncations, byte flips, huge or lying header
lengths, out-of-file offsets, traversal names for the tokenizer) must each be accepted with
the schema's guarantees or refused with one `ValueError` line naming the file; nothing
outside the directory is opened and the peak allocation stays within a small multiple of
the file's size.
"""

import hashlib
import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save as save_bytes

from gpn_jax.checkpoints import model_dir as md
from tests.helpers.fuzz import one_line, watch

TENSORS = {"a.w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(5, np.int32)}
EXPECTED = {k: (v.shape, str(v.dtype)) for k, v in TENSORS.items()}
WEIGHTS = save_bytes(TENSORS)
TOKENIZER = b"not really a sentencepiece model"
RECORD = {
    "format": "gpn_jax",
    "gpn_jax_version": "0",
    "family": "gpn",
    "step": 3,
    "tokens_seen": 96,
    "tokenizer_file": "tokenizer.model",
    "tokenizer_sha256": hashlib.sha256(TOKENIZER).hexdigest(),
    "model": {"d_model": 8},
    "config": {"model": {"d_model": 8}, "data": {"source": "x"}},
}
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip
TRAVERSALS = ["/etc/passwd", "../tokenizer.model", "..", ".", "", "a/../../x", "sub/t.model",
              "..\\x", "t\x00.model", "/", "~/t.model", "tokenizer.model/"]  # fmt: skip


@st.composite
def config_json(draw) -> bytes:
    how = draw(st.sampled_from(["field", "drop", "top", "tokenizer", "bytes", "nested"]))
    record = json.loads(json.dumps(RECORD))
    if how == "field":
        record[draw(st.sampled_from(sorted(record)))] = draw(JSON)
    elif how == "drop":
        record.pop(draw(st.sampled_from(sorted(record))))
    elif how == "top":
        record = draw(JSON)
    elif how == "tokenizer":
        record["tokenizer_file"] = draw(st.sampled_from(TRAVERSALS) | st.text(max_size=12))
    elif how == "nested":
        record["config"][draw(st.sampled_from(["model", "data"]))] = draw(JSON)
    data = bytearray(json.dumps(record).encode())
    if how == "bytes":
        if draw(st.booleans()):
            data = data[: draw(st.integers(0, len(data)))]
        else:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


def _write(folder, config: bytes, weights: bytes = WEIGHTS) -> None:
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_bytes(config)
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "tokenizer.model").write_bytes(TOKENIZER)


def _check_config(tmp_path, config: bytes) -> None:
    folder = tmp_path / "model"
    _write(folder, config)
    path = str(folder / "config.json")
    with watch() as w:
        try:
            record = md.read_record(str(folder))
            tok = md.tokenizer_path(str(folder), record)
        except ValueError as e:
            one_line(e, str(folder))
        else:
            assert isinstance(record["step"], int) and record["step"] >= 0
            assert isinstance(record["config"]["model"], dict)
            assert tok is None or os.path.dirname(tok) == str(folder)
    assert not w.outside(str(folder)), w.outside(str(folder))
    assert w.peak <= 64 * len(config) + (1 << 20), (w.peak, path)


@st.composite
def safetensors_file(draw) -> bytes:
    how = draw(st.sampled_from(["truncate", "flip", "length", "header", "entry"]))
    data = bytearray(WEIGHTS)
    n = int.from_bytes(data[:8], "little")
    if how == "truncate":
        return bytes(data[: draw(st.integers(0, len(data) - 1))])
    if how == "flip":
        for _ in range(draw(st.integers(1, 3))):
            data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
        return bytes(data)
    if how == "length":
        value = draw(st.integers(0, 2**64 - 1) | st.sampled_from([n - 1, n + 1, 2**62, 0]))
        return value.to_bytes(8, "little") + bytes(data[8:])
    header = json.loads(data[8 : 8 + n])
    if how == "header":
        header = draw(JSON)
    else:
        name = draw(st.sampled_from(sorted(TENSORS)))
        key = draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
        header[name][key] = draw(
            JSON | st.lists(st.integers(-(2**63), 2**64), max_size=3) | st.sampled_from(["O", "F8"])
        )
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + bytes(data[8 + n :])


@pytest.fixture(scope="module", autouse=True)
def _warm(tmp_path_factory):
    """One read before any is measured: the first one initialises JAX's backend (once)."""
    path = tmp_path_factory.mktemp("warm") / "model.safetensors"
    path.write_bytes(WEIGHTS)
    md.read_tensors(str(path), EXPECTED)


def _check_weights(tmp_path, weights: bytes) -> None:
    folder = tmp_path / "model"
    _write(folder, json.dumps(RECORD).encode(), weights)
    path = str(folder / "model.safetensors")
    with watch() as w:
        try:
            got = md.read_tensors(path, EXPECTED)
        except ValueError as e:
            one_line(e, path)
        else:
            assert {k: (v.shape, str(v.dtype)) for k, v in got.items()} == EXPECTED
    assert not w.outside(str(folder)), w.outside(str(folder))
    assert w.peak <= 64 * len(weights) + (1 << 20), (w.peak, len(weights))


SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@settings(max_examples=300, **SETTINGS)
@given(config=config_json())
def test_fuzz_config_json(tmp_path, config):
    _check_config(tmp_path, config)


@settings(max_examples=300, **SETTINGS)
@given(weights=safetensors_file())
def test_fuzz_safetensors(tmp_path, weights):
    _check_weights(tmp_path, weights)


@pytest.mark.slow
@settings(max_examples=1000, **SETTINGS)
@given(config=config_json(), weights=safetensors_file())
def test_fuzz_model_dir_many(tmp_path, config, weights):
    _check_config(tmp_path, config)
    _check_weights(tmp_path, weights)


def test_the_base_files_are_valid(tmp_path):
    """Every malformation starts from files the loaders accept."""
    _write(tmp_path / "model", json.dumps(RECORD).encode())
    assert md.read_record(str(tmp_path / "model"))["step"] == 3
    got = md.read_tensors(str(tmp_path / "model" / "model.safetensors"), EXPECTED)
    np.testing.assert_array_equal(got["a.w"], TENSORS["a.w"])
