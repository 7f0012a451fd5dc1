"""build_data end to end: embedded / text / bin specs, caching, resume, split, errors."""

import json
import os

import numpy as np
import pytest

from gpn_jax.data.bin_source import ShardedTokens
from gpn_jax.data.pipeline import build_data
from gpn_jax.data.text_sources import embedded_corpus
from gpn_jax.data.tokenizer import train_tokenizer

V, T, B = 1024, 64, 8


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="module")
def data(workdir):
    return build_data(
        "embedded",
        vocab_size=V,
        seq_len=T,
        batch_size=B,
        heldout_fraction=0.1,
        seed=1,
        workdir=workdir,
    )


def test_embedded_build_trains_and_saves_tokenizer(data, workdir):
    assert os.path.exists(os.path.join(workdir, "tokenizer.model"))
    assert os.listdir(os.path.join(workdir, "data_cache"))
    assert data.tokenizer.vocab_size == V and data.eos_id == 2
    batch = next(
        build_data(
            "embedded",
            vocab_size=V,
            seq_len=T,
            batch_size=B,
            seed=1,
            heldout_fraction=0.1,
            workdir=workdir,
        ).train
    )
    assert batch.shape == (B, T) and batch.dtype == np.int32
    assert data.unigram_counts.shape == (V,) and data.unigram_counts.sum() == len(data.train_tokens)
    assert "embedded corpus" in data.description and "held-out" in data.description


def test_rebuild_reuses_tokenizer_and_is_deterministic(data, workdir, tmp_path):
    again = build_data(
        "embedded",
        vocab_size=V,
        seq_len=T,
        batch_size=B,
        heldout_fraction=0.1,
        seed=1,
        workdir=workdir,
    )
    assert again.tokenizer.path == os.path.join(workdir, "tokenizer.model")
    fresh = build_data(
        "embedded",
        vocab_size=V,
        seq_len=T,
        batch_size=B,
        heldout_fraction=0.1,
        seed=1,
        workdir=str(tmp_path),
    )
    assert fresh.tokenizer.model_proto == data.tokenizer.model_proto
    np.testing.assert_array_equal(fresh.train_tokens, again.train_tokens)
    for _ in range(3):
        np.testing.assert_array_equal(next(fresh.train), next(again.train))


def test_train_never_reads_heldout(data):
    corpus = "".join(embedded_corpus())
    tok = data.tokenizer
    assert tok.decode(data.train_tokens) + tok.decode(data.heldout) == corpus
    it = data.train
    train_rows = {row.tobytes() for _ in range(it.steps_per_epoch) for row in next(it)}
    held_rows = [row.tobytes() for batch in data.heldout_windows() for row in batch]
    assert held_rows and not train_rows.intersection(held_rows)


def test_resume_through_build_data(workdir):
    kw = dict(vocab_size=V, seq_len=T, batch_size=B, heldout_fraction=0.1, seed=4, workdir=workdir)
    full = build_data("embedded", **kw).train
    batches = [next(full) for _ in range(5)]
    first = build_data("embedded", **kw).train
    next(first), next(first)
    state = json.loads(json.dumps(first.get_state()))
    resumed = build_data("embedded", train_state=state, **kw).train
    for want in batches[2:]:
        np.testing.assert_array_equal(next(resumed), want)


def test_host_sharded_build(data, workdir):
    kw = dict(vocab_size=V, seq_len=T, batch_size=B, heldout_fraction=0.1, seed=1, workdir=workdir)
    hosts = [build_data("embedded", process_index=p, process_count=2, **kw) for p in range(2)]
    whole = build_data("embedded", **kw)
    np.testing.assert_array_equal(np.concatenate([next(h.train) for h in hosts]), next(whole.train))
    held = [next(h.heldout_windows()) for h in hosts]
    np.testing.assert_array_equal(np.concatenate(held), next(whole.heldout_windows()))


def test_text_dir_vocab_mismatch_and_size_errors(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = [json.dumps({"text": d}) for d in embedded_corpus()[:12]]
    (corpus / "part.jsonl").write_text("\n".join(lines))
    tok = str(tmp_path / "tok.model")
    train_tokenizer(embedded_corpus()[:12], 512, tok)
    with pytest.raises(ValueError, match="tokenizer vocab 512 != model vocab_size 1024"):
        build_data(str(corpus), vocab_size=1024, seq_len=T, batch_size=B, tokenizer_path=tok)
    with pytest.raises(
        ValueError,
        match=r"train corpus too small: \d+ tokens available, one "
        r"\(4096, 64\) batch needs 262144",
    ):
        build_data(str(corpus), vocab_size=512, seq_len=T, batch_size=4096, tokenizer_path=tok)
    with pytest.raises(ValueError, match="held-out split too small"):
        build_data(
            str(corpus),
            vocab_size=512,
            seq_len=T,
            batch_size=64,
            tokenizer_path=tok,
            heldout_fraction=0.01,
        )
    ok = build_data(f"text:{corpus}", vocab_size=512, seq_len=T, batch_size=B, tokenizer_path=tok)
    assert "12 docs" in ok.description


def test_spec_errors(tmp_path):
    kw = dict(vocab_size=V, seq_len=T, batch_size=B)
    with pytest.raises(ValueError, match="unknown data spec"):
        build_data("s3x:bucket", **kw)
    with pytest.raises(ValueError, match="data path not found"):
        build_data(str(tmp_path / "missing"), **kw)
    (tmp_path / "blank.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="empty corpus"):
        build_data(str(tmp_path), **kw)


def write_shards(directory, sizes, dtype=np.uint32):
    start = 0
    for i, n in enumerate(sizes):
        np.arange(start, start + n, dtype=dtype).tofile(directory / f"data_{i:04d}.bin")
        start += n
    return start


def test_bin_shards_exact_windows_split_and_counts(tmp_path):
    total = write_shards(tmp_path, [100, 37, 63])  # windows straddle shard boundaries
    data = build_data(
        f"bin:{tmp_path}",
        vocab_size=256,
        seq_len=8,
        batch_size=2,
        heldout_fraction=0.2,
        train_layout="sequential",
    )
    assert isinstance(data.train_tokens, ShardedTokens) and data.tokenizer is None
    assert len(data.train_tokens) == 160 and len(data.heldout) == 40 and total == 200
    for k in range(10):
        np.testing.assert_array_equal(
            next(data.train), np.arange(16 * k, 16 * k + 16).reshape(2, 8)
        )
    np.testing.assert_array_equal(next(data.train), np.arange(16).reshape(2, 8))  # next epoch
    held = np.concatenate(list(data.heldout_windows()))
    np.testing.assert_array_equal(held.ravel(), np.arange(160, 192))
    np.testing.assert_array_equal(data.unigram_counts, (np.arange(256) < 160).astype(np.int64))
    shuffled = build_data(
        f"bin:{tmp_path}",
        vocab_size=256,
        seq_len=8,
        batch_size=2,
        heldout_fraction=0.2,
        cache_dir=str(tmp_path / "cache"),
    )
    seen = np.concatenate([next(shuffled.train) for _ in range(10)])
    assert sorted(seen[:, 0]) == list(range(0, 160, 8)) and seen.max() < 160


def test_bin_uint16_and_vocab_too_small(tmp_path):
    write_shards(tmp_path, [64, 64], np.uint16)
    data = build_data(
        f"bin:{tmp_path / 'data_0001.bin'}",
        vocab_size=200,
        seq_len=8,
        batch_size=2,
        heldout_fraction=0.0,
        bin_dtype="uint16",
        train_layout="sequential",
    )
    np.testing.assert_array_equal(next(data.train), np.arange(64, 80).reshape(2, 8))
    with pytest.raises(ValueError, match="token id 127 >= vocab_size 100"):
        build_data(
            f"bin:{tmp_path}",
            vocab_size=100,
            seq_len=8,
            batch_size=2,
            heldout_fraction=0.0,
            bin_dtype="uint16",
        )
