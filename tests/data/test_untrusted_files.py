"""Prepared-corpus manifests, `.npy` caches and tokenizer files are untrusted input: a bad one
is refused in one `BadFileError` line naming the file, before numpy or SentencePiece sees it."""

import hashlib
import os

import numpy as np
import pytest

from gpn_jax.data.pipeline import build_data
from gpn_jax.data.prepare.manifest import read_prepared
from gpn_jax.data.stream import cached_token_stream, stream_key
from gpn_jax.data.text_sources import embedded_corpus
from gpn_jax.data.tokenizer import load_tokenizer, train_tokenizer
from gpn_jax.io.untrusted import BadFileError
from tests.data.corpus_files import write_corpus, write_manifest

V = 512


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tok") / "tok.model")
    train_tokenizer(embedded_corpus()[:40], V, path)
    return path


def test_a_well_formed_manifest_is_read(tmp_path):
    write_corpus(tmp_path / "c")
    corpus = read_prepared(str(tmp_path / "c"))
    assert corpus.dtype == "uint16" and len(corpus.train) == 2 and len(corpus.heldout) == 1
    assert corpus.tokenizer_path == os.path.realpath(tmp_path / "c" / "tokenizer.model")


@pytest.mark.parametrize("dtype", ["O", "float64", [], {"x": 1}, "int8", None, "<u4"])
def test_a_dtype_off_the_allow_list_never_reaches_numpy(tmp_path, dtype):
    """Issue 45 item 1: `"dtype": "O"` made numpy read shard bytes as object pointers."""
    m = write_corpus(tmp_path / "c")
    write_manifest(tmp_path / "c", dict(m, dtype=dtype))
    with pytest.raises(
        BadFileError, match=r"manifest\.json: dtype .* is not one of uint16, uint32"
    ):
        read_prepared(str(tmp_path / "c"))


def _set_shard(m, name):
    m["splits"]["train"]["shards"][0]["file"] = name
    return m


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda m, out: _set_shard(m, out), r"splits\.train\.shards\[0\]\.file"),
        (lambda m, out: _set_shard(m, "../sibling/data.bin"), r"splits\.train\.shards\[0\]\.file"),
        (lambda m, out: dict(m, tokenizer=dict(m["tokenizer"], file=out)), r"tokenizer\.file"),
        (lambda m, out: dict(m, tokenizer=dict(m["tokenizer"], file="../t.model")), "tokenizer"),
    ],
)
def test_names_that_leave_the_directory_are_refused(tmp_path, edit, field):
    """Issue 45 item 3: absolute and `..` names read files outside the corpus."""
    outside = tmp_path / "sibling" / "data.bin"
    outside.parent.mkdir()
    np.arange(40, dtype=np.uint16).tofile(outside)
    m = write_corpus(tmp_path / "c")
    write_manifest(tmp_path / "c", edit(m, str(outside)))
    with pytest.raises(BadFileError, match=field + ".* leaves the directory"):
        read_prepared(str(tmp_path / "c"))


def test_a_symlink_out_of_the_directory_is_refused(tmp_path):
    outside = tmp_path / "secret"
    np.arange(40, dtype=np.uint16).tofile(outside)
    write_corpus(tmp_path / "c")
    os.remove(tmp_path / "c" / "train" / "data_0000.bin")
    os.symlink(outside, tmp_path / "c" / "train" / "data_0000.bin")
    with pytest.raises(BadFileError, match="is a link that leaves the directory"):
        read_prepared(str(tmp_path / "c"))


def test_token_counts_are_checked_against_the_shard_sizes(tmp_path):
    m = write_corpus(tmp_path / "c")
    m["splits"]["heldout"]["shards"][0]["tokens"] = 10**15  # would be a 2 PB memory map
    write_manifest(tmp_path / "c", m)
    shard = os.path.realpath(tmp_path / "c" / "heldout" / "data_0000.bin")
    with pytest.raises(BadFileError, match=f"^{shard}: 32 bytes, but manifest.json records"):
        read_prepared(str(tmp_path / "c"))


@pytest.mark.parametrize(
    "edit, what",
    [
        (lambda m: [m], "the manifest is not an object"),
        (lambda m: dict(m, splits=[]), "splits is not an object"),
        (lambda m: dict(m, splits=dict(m["splits"], train={"shards": {}})), "shards is not a"),
        (lambda m: dict(m, tokenizer="tokenizer.model"), "tokenizer is not an object"),
        (lambda m: dict(m, tokenizer=dict(m["tokenizer"], sha256=None)), "sha256"),
        (lambda m: dict(m, document_separator={"id": None}), "document_separator.id"),
        (lambda m: dict(m, document_separator={"id": 70000}), "document_separator.id"),
        (lambda m: dict(m, format=1), "not a gpn_jax.prepare/1 manifest"),
    ],
)
def test_wrong_json_types_are_one_line(tmp_path, edit, what):
    m = write_corpus(tmp_path / "c")
    write_manifest(tmp_path / "c", edit(m))
    with pytest.raises(BadFileError, match=r"manifest\.json: .*" + what.replace(".", r"\.")):
        read_prepared(str(tmp_path / "c"))


def test_a_manifest_that_is_not_json_is_one_line(tmp_path):
    write_corpus(tmp_path / "c")
    (tmp_path / "c" / "manifest.json").write_bytes(b"[" * 100_000)
    with pytest.raises(BadFileError, match="not valid JSON"):
        read_prepared(str(tmp_path / "c"))


def _corpus_with_tokenizer(directory, tokenizer_path, **kw):
    m = write_corpus(directory, **kw)
    proto = open(tokenizer_path, "rb").read()
    (directory / "tokenizer.model").write_bytes(proto)
    m["tokenizer"]["sha256"] = hashlib.sha256(proto).hexdigest()
    write_manifest(directory, m)


def test_small_prepared_heldout_names_the_prepare_flag(tmp_path, tokenizer_path):
    """Issue 45 item 9: the training config's heldout_fraction does not apply to a prepared
    corpus; the error names `gpn-prepare --heldout_fraction`."""
    _corpus_with_tokenizer(tmp_path / "c", tokenizer_path, train=(400,), heldout=(16,))
    with pytest.raises(ValueError, match="re-run gpn-prepare with a larger --heldout_fraction"):
        build_data(f"bin:{tmp_path / 'c'}", vocab_size=V, seq_len=8, batch_size=4)
    data = build_data(f"bin:{tmp_path / 'c'}", vocab_size=V, seq_len=4, batch_size=4)
    assert len(data.heldout) == 16


def _npy_header(descr: str, shape) -> bytes:
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode()


@pytest.mark.parametrize(
    "content, what",
    [
        (lambda: _npy_header("<f8", "(3,)") + bytes(24), "dtype <f8 is not one of uint32"),
        (lambda: _npy_header("<u4", "(1000000000000,)") + bytes(8), "header says"),
        (lambda: _npy_header("|O", "(1,)") + bytes(8), "dtype |O is not one of uint32"),
        (lambda: _npy_header("<u4", "(2, 2)") + bytes(16), "shape .* is not 1-dimensional"),
        (lambda: b"\x93NUMPY\x01\x00\xff\xff" + bytes(70000), "not a valid .npy array"),
        (lambda: b"", "not a valid .npy array"),
    ],
)
def test_a_bad_token_cache_names_the_file_to_delete(tmp_path, tokenizer_path, content, what):
    """Issue 45 item 7: a float or huge-shape `.npy` cache gave a traceback."""
    tok, docs = load_tokenizer(tokenizer_path), ["one document", "another document"]
    cache = tmp_path / f"train-{stream_key(docs, tok)}.npy"
    cache.write_bytes(content())
    with pytest.raises(BadFileError, match=f"^{cache}: {what}.*delete this cache file"):
        cached_token_stream(docs, tok, str(tmp_path), "train")


def test_a_good_token_cache_is_read_back(tmp_path, tokenizer_path):
    tok, docs = load_tokenizer(tokenizer_path), ["one document", "another document"]
    first = cached_token_stream(docs, tok, str(tmp_path), "train")
    np.testing.assert_array_equal(cached_token_stream(docs, tok, str(tmp_path), "train"), first)


def test_a_bad_count_cache_names_the_file_to_delete(tmp_path, tokenizer_path):
    _corpus_with_tokenizer(tmp_path / "c", tokenizer_path, train=(400,), heldout=(64,))
    geometry = dict(vocab_size=V, seq_len=4, batch_size=4, cache_dir=str(tmp_path / "cache"))
    good = build_data(f"bin:{tmp_path / 'c'}", **geometry).unigram_counts
    for f in (tmp_path / "cache").iterdir():
        np.save(f, np.zeros(7, np.int64))
    with pytest.raises(BadFileError, match="7 counts for vocab_size 512; delete this cache"):
        build_data(f"bin:{tmp_path / 'c'}", **geometry)
    for f in (tmp_path / "cache").iterdir():
        f.unlink()
    np.testing.assert_array_equal(
        build_data(f"bin:{tmp_path / 'c'}", **geometry).unigram_counts, good
    )


@pytest.mark.parametrize("content", [b"", b"\x00" * 100, b"\x0a\xff\xff\xff\xff\x0f"])
def test_a_tokenizer_that_is_not_a_model_is_one_line(tmp_path, content):
    path = tmp_path / "t.model"
    path.write_bytes(content)
    with pytest.raises(BadFileError, match=f"^{path}: .*delete this one"):
        load_tokenizer(str(path))


def test_a_directory_as_tokenizer_is_one_line(tmp_path):
    with pytest.raises(BadFileError, match="not a regular file"):
        load_tokenizer(str(tmp_path))


@pytest.mark.parametrize(
    "content, what",
    [(b"[]", "not a JSON object"), (b'{"writers": []}', "writers is not an object"),
     (b'{"writers": {"train": {"shards": 3}}}', "writers is not an object"), (b"\xff", "JSON")],
)  # fmt: skip
def test_a_damaged_progress_file_is_one_line(tmp_path, content, what):
    from gpn_jax.data.prepare.manifest import check_output

    (tmp_path / "progress.json").write_bytes(content)
    with pytest.raises(BadFileError, match=f"progress.json: .*{what}.*delete the output directory"):
        check_output(str(tmp_path), {"source": "x"})


def test_an_object_dtype_corpus_named_by_a_restored_or_exported_run_is_one_line(tmp_path):
    """Issue 45 item 1, second path: evaluating an exported model directory (or a workdir)
    rebuilds the held-out split from the data block its config records; a corpus there whose
    manifest says `"dtype": "O"` is refused the same way (no segfault)."""
    from experiments.configs import gpn_m_tiny
    from gpn_jax.checkpoints.restore import RestoredRun
    from gpn_jax.eval import run_evals

    manifest = write_corpus(tmp_path / "corpus")
    write_manifest(tmp_path / "corpus", dict(manifest, dtype="O"))
    config = gpn_m_tiny.get_config()
    config.data.source = f"bin:{tmp_path / 'corpus'}"
    run = RestoredRun(config, None, {}, None, 0, str(tmp_path / "model_dir"))
    with pytest.raises(BadFileError, match=r"manifest\.json: dtype 'O' is not one of"):
        run_evals(run, ["ppl"], cache_dir=str(tmp_path / "cache"))
