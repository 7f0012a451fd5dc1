"""Fuzzing the tokenizer loader (`data.tokenizer.load_tokenizer`): a few hundred generated
malformed SentencePiece model files (truncations, byte flips, inserted and random bytes, a
directory, an oversized file). Each either loads as a tokenizer that encodes and decodes, or
raises the one-line `BadFileError` naming the file; only that file is opened, and Python-side
allocation stays within a fixed multiple of its size (SentencePiece's own C++ parse of the
protobuf is bounded by the bytes it is given, which are the file's)."""

import functools
import os
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpn_jax.data.text_sources import embedded_corpus
from gpn_jax.data.tokenizer import MAX_MODEL_BYTES, load_tokenizer, train_tokenizer
from gpn_jax.io.untrusted import BadFileError
from tests.fuzz.fuzzing import assert_inside, damaged, peak_allocation, recorded_opens

SLACK = 256 << 10  # the wrapper's Python objects: independent of the file


@functools.cache
def good_model() -> bytes:
    return train_tokenizer(embedded_corpus()[:20], 400).model_proto


def check(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "tokenizer.model")
        with open(path, "wb") as f:
            f.write(content)
        with recorded_opens() as opened, peak_allocation() as peak:
            try:
                tokenizer = load_tokenizer(path)
            except BadFileError as e:
                assert str(e).startswith(path + ": ") and "\n" not in str(e)
                tokenizer = None
        assert_inside(opened, d)
        assert peak[0] <= 4 * len(content) + SLACK, (peak[0], len(content))
        if tokenizer is not None:  # whatever loads is a working tokenizer
            assert tokenizer.vocab_size >= 1
            tokenizer.decode(tokenizer.encode("hello world 123"))


FAST = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MORE = settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(st.deferred(lambda: damaged(good_model())))  # trained on first use
def test_damaged_model(content):
    check(content)


def test_the_good_model_loads_and_empty_is_refused():
    check(good_model())
    with pytest.raises(AssertionError):  # sanity: check() itself would notice an unread file
        assert_inside(["/etc/passwd"], tempfile.gettempdir())
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.model")
        open(path, "wb").close()
        with pytest.raises(BadFileError, match="not a SentencePiece model"):
            load_tokenizer(path)


def test_a_directory_or_an_oversized_file_is_refused_unread(tmp_path):
    with pytest.raises(BadFileError, match="not a regular file"):
        load_tokenizer(str(tmp_path))
    huge = tmp_path / "huge.model"
    with open(huge, "wb") as f:
        f.truncate(MAX_MODEL_BYTES + 1)  # sparse: no disk used
    with recorded_opens() as opened, pytest.raises(BadFileError, match="over .* bytes"):
        load_tokenizer(str(huge))
    assert opened == []


@pytest.mark.slow
@MORE
@given(st.deferred(lambda: damaged(good_model())))  # trained on first use
def test_many_damaged_models(content):
    check(content)
