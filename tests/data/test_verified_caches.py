"""Caches and shards are verified by content on every load (issue 51, cases 6 and 9): a held-out
token cache is checked against the vocabulary, a shard rewritten with the same size and mtime
is read afresh, and a prepared corpus's train and held-out shards are disjoint."""

import hashlib
import os
import shutil

import numpy as np
import pytest

from gpn_jax.data.pipeline import build_data
from gpn_jax.data.stream import cached_token_stream, stream_key
from gpn_jax.data.text_sources import embedded_corpus
from gpn_jax.data.tokenizer import load_tokenizer, train_tokenizer
from gpn_jax.io.untrusted import BadFileError
from tests.data.corpus_files import write_corpus, write_manifest

V = 512
GEOMETRY = dict(vocab_size=V, seq_len=4, batch_size=4)


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tok") / "tok.model")
    train_tokenizer(embedded_corpus(), V, path)
    return path


def corpus(directory, tokenizer_path, **kw) -> dict:
    """A prepared corpus (ids < 100) whose tokenizer is the real V-piece model."""
    m = write_corpus(directory, train=(400, 200), heldout=(64,), **kw)
    proto = open(tokenizer_path, "rb").read()
    (directory / "tokenizer.model").write_bytes(proto)
    m["tokenizer"]["sha256"] = hashlib.sha256(proto).hexdigest()
    write_manifest(directory, m)
    return m


@pytest.mark.parametrize("split", ["heldout", "train"])
def test_a_token_cache_with_ids_outside_the_vocabulary_is_one_line(tmp_path, tokenizer_path, split):
    """The held-out cache was loaded unchecked (evaluate printed PPL nan, training failed with a
    traceback); every token cache is now checked against the tokenizer on each load."""
    tok, docs = load_tokenizer(tokenizer_path), ["one document", "another document"]
    good = cached_token_stream(docs, tok, str(tmp_path), split)
    cache = tmp_path / f"{split}-{stream_key(docs, tok)}.npy"
    assert cache.exists()
    np.save(cache, np.full(len(good), V + 7, np.uint32))
    with pytest.raises(BadFileError, match=f"^{cache}: token id {V + 7} >= .*delete this cache"):
        cached_token_stream(docs, tok, str(tmp_path), split)


def test_a_shard_rewritten_with_the_same_size_and_mtime_is_checked_again(tmp_path, tokenizer_path):
    """The count cache was keyed on (path, size, mtime): a shard rewritten with ids outside the
    vocabulary, its mtime restored, skipped the id check. It is keyed on content now."""
    corpus(tmp_path / "c", tokenizer_path)
    source = f"bin:{tmp_path / 'c'}"
    cache = dict(cache_dir=str(tmp_path / "cache"))
    build_data(source, **GEOMETRY, **cache)
    for split in ("train", "heldout"):
        shard = tmp_path / "c" / split / "data_0000.bin"
        st = shard.stat()
        original = shard.read_bytes()
        shard.write_bytes(np.full(st.st_size // 2, V + 1, np.uint16).tobytes())
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
        with pytest.raises(ValueError, match=f"data_0000.bin: token id {V + 1} >= vocab_size {V}"):
            build_data(source, **GEOMETRY, **cache)
        shard.write_bytes(original)
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_counts_follow_a_rewritten_shard(tmp_path, tokenizer_path):
    """Valid ids rewritten under the same size and mtime: the unigram counts are those of the
    new bytes, never the cached counts of the old ones."""
    corpus(tmp_path / "c", tokenizer_path)
    source, cache = f"bin:{tmp_path / 'c'}", dict(cache_dir=str(tmp_path / "cache"))
    build_data(source, **GEOMETRY, **cache)
    shard = tmp_path / "c" / "train" / "data_0000.bin"
    st = shard.stat()
    shard.write_bytes(np.full(st.st_size // 2, 5, np.uint16).tobytes())
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    data = build_data(source, **GEOMETRY, **cache)
    train = np.concatenate([np.fromfile(tmp_path / "c" / "train" / f, np.uint16)
                            for f in ("data_0000.bin", "data_0001.bin")])  # fmt: skip
    np.testing.assert_array_equal(data.unigram_counts, np.bincount(train, minlength=V))


@pytest.mark.parametrize("how", ["listed", "symlink", "hardlink", "copy"])
def test_a_heldout_shard_among_the_train_shards_is_one_line(tmp_path, tokenizer_path, how):
    """Case 9: a manifest listing a held-out shard among the training shards trained on held-out
    data without a word. Refused by the same file (path, link, inode) or the same bytes."""
    d = tmp_path / "c"
    m = corpus(d, tokenizer_path)
    held = d / "heldout" / "data_0000.bin"
    extra = {"file": "train/data_0002.bin", "tokens": 64, "documents": 1}
    if how == "listed":
        extra["file"] = "heldout/data_0000.bin"
    elif how == "symlink":
        (d / "train" / "data_0002.bin").symlink_to(held)
    elif how == "hardlink":
        os.link(held, d / "train" / "data_0002.bin")
    else:
        shutil.copyfile(held, d / "train" / "data_0002.bin")
    m["splits"]["train"]["shards"].append(extra)
    write_manifest(d, m)
    what = "the same bytes as" if how == "copy" else "the same file as"
    with pytest.raises(BadFileError, match=f"manifest.json: held-out shard .* is {what} train"):
        build_data(f"bin:{d}", **GEOMETRY)


def test_a_cache_swapped_for_another_is_caught_by_its_recorded_digest(tmp_path, tokenizer_path):
    """Ids in range but other tokens (one cache copied over another's name): the sha256 recorded
    when the cache was written no longer matches."""
    tok = load_tokenizer(tokenizer_path)
    docs, others = ["one document", "another document"], ["something else entirely"]
    cached_token_stream(docs, tok, str(tmp_path), "train")
    cached_token_stream(others, tok, str(tmp_path), "heldout")
    train = tmp_path / f"train-{stream_key(docs, tok)}.npy"
    shutil.copyfile(tmp_path / f"heldout-{stream_key(others, tok)}.npy", train)
    with pytest.raises(BadFileError, match=f"^{train}: its content is not what was written"):
        cached_token_stream(docs, tok, str(tmp_path), "train")


def test_a_cache_without_a_digest_is_rebuilt(tmp_path, tokenizer_path):
    """A cache written before digests (or a write killed between the two files) is rebuilt,
    not trusted, and gets its digest."""
    tok, docs = load_tokenizer(tokenizer_path), ["one document", "another document"]
    good = cached_token_stream(docs, tok, str(tmp_path), "train")
    cache = tmp_path / f"train-{stream_key(docs, tok)}.npy"
    os.remove(f"{cache}.sha256")
    np.save(cache, np.zeros(3, np.uint32))  # in range, but not these documents' tokens
    np.testing.assert_array_equal(cached_token_stream(docs, tok, str(tmp_path), "train"), good)
    assert os.path.exists(f"{cache}.sha256")
    np.testing.assert_array_equal(cached_token_stream(docs, tok, str(tmp_path), "train"), good)
