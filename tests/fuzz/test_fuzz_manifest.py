"""Fuzzing the prepared-corpus manifest reader (`data.prepare.manifest.read_prepared`): a few
hundred generated malformed manifests (truncations, byte flips, any JSON value in place of
any field, traversal names, huge counts). Each is either read as a corpus whose every path lies
inside its directory and whose shards have the recorded sizes, or refused with the one-line
`BadFileError`; nothing outside the directory is opened, and the reader allocates at most a
fixed multiple of the manifest's own size (it never allocates what a count claims)."""

import atexit
import copy
import functools
import json
import os
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpn_jax.data.bin_source import ShardedTokens, memmap_shard
from gpn_jax.data.prepare.manifest import read_prepared
from gpn_jax.io.untrusted import BadFileError
from tests.data.corpus_files import write_corpus
from tests.fuzz.fuzzing import (
    TRAVERSAL_NAMES,
    assert_inside,
    damaged,
    json_values,
    peak_allocation,
    recorded_opens,
)

# json.loads builds Python objects of a few dozen bytes per input byte; plus a fixed slack.
PER_BYTE, SLACK = 64, 256 << 10


def _template():
    with tempfile.TemporaryDirectory() as d:
        return write_corpus(os.path.join(d, "c"))


GOOD = _template()
GOOD_BYTES = json.dumps(GOOD).encode()
# Every field path of the good manifest (dict keys and list indices), for targeted damage.
FIELDS = []


def _walk(value, path=()):
    FIELDS.append(path)
    if isinstance(value, dict):
        for k, v in value.items():
            _walk(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _walk(v, (*path, i))


_walk(GOOD)


def _replace(manifest, path, value):
    if not path:
        return value
    out = copy.deepcopy(manifest)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


@st.composite
def wrong_field(draw) -> bytes:
    """The good manifest with one field (or the whole) replaced by any JSON value."""
    path = draw(st.sampled_from(FIELDS))
    value = draw(json_values() | st.sampled_from(TRAVERSAL_NAMES) | st.integers(-(2**64), 2**64))
    return json.dumps(_replace(GOOD, path, value)).encode()


@st.composite
def traversal(draw) -> bytes:
    """A shard or the tokenizer named by a path meant to leave the directory."""
    name = draw(st.sampled_from(TRAVERSAL_NAMES + ["../outside.bin", "link.bin"]))
    field = draw(st.sampled_from([("tokenizer", "file"), ("splits", "train", "shards", 0, "file"),
                                  ("splits", "heldout", "shards", 0, "file")]))  # fmt: skip
    return json.dumps(_replace(GOOD, field, name)).encode()


@functools.cache
def _corpus() -> str:
    """One corpus for the whole module (only its manifest changes between examples), with a
    readable file next to it and a link to that file inside: neither may be read."""
    root = tempfile.mkdtemp(prefix="fuzz_manifest_")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    corpus = os.path.join(root, "c")
    write_corpus(corpus)
    np.arange(40, dtype=np.uint16).tofile(os.path.join(root, "outside.bin"))
    os.symlink(os.path.join(root, "outside.bin"), os.path.join(corpus, "link.bin"))
    return corpus


def check(content: bytes):
    """The corpus read from a manifest of `content` (None if refused), checked as the module
    doc says."""
    corpus = _corpus()
    with open(os.path.join(corpus, "manifest.json"), "wb") as f:
        f.write(content)
    with recorded_opens() as opened, peak_allocation() as peak:
        try:
            prepared = read_prepared(corpus)
        except BadFileError as e:
            assert "\n" not in str(e) and ": " in str(e)
            prepared = None
    assert_inside(opened, corpus)
    assert peak[0] <= PER_BYTE * len(content) + SLACK, (peak[0], len(content))
    if prepared is None:
        return None
    files = [*prepared.train, *prepared.heldout, prepared.tokenizer_path]
    assert_inside(files, corpus)
    dtype = np.dtype(prepared.dtype)  # from the allow-list: uint16 or uint32
    assert dtype in (np.uint16, np.uint32)
    tokens = ShardedTokens([memmap_shard(p, dtype) for p in prepared.train])
    assert len(tokens[:]) == len(tokens)
    return prepared


FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MORE = settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(damaged(GOOD_BYTES))
def test_damaged_bytes(content):
    check(content)


@FAST
@given(wrong_field())
def test_wrong_json_types(content):
    check(content)


@settings(max_examples=60, deadline=None)
@given(traversal())
def test_traversal_names_are_refused(content):
    assert check(content) is None


def test_the_good_manifest_is_read():
    assert check(GOOD_BYTES).dtype == "uint16"


@pytest.mark.slow
@MORE
@given(damaged(GOOD_BYTES) | wrong_field() | traversal())
def test_many_malformed_manifests(content):
    check(content)
