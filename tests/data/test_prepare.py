"""gpn_jax.prepare: formats, determinism over workers, document boundaries, held-out split,
resume after a kill, `bin:` training on the output, and one-line errors for bad input."""

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow_datasets as tfds
import zstandard

from gpn_jax.data.pipeline import build_data
from gpn_jax.data.prepare.heldout import document_difficulty, stratified_records
from gpn_jax.data.prepare.inputs import open_source
from gpn_jax.data.prepare.parallel import ordered_map
from gpn_jax.data.prepare.run import (
    KILL_AFTER_SHARDS_ENV,
    Options,
    check_options,
    prepare_corpus,
    token_dtype,
)
from gpn_jax.data.prepare.tokenizer_step import training_sample
from gpn_jax.data.text_sources import embedded_corpus
from gpn_jax.data.tokenizer import load_tokenizer, train_tokenizer
from tests.environment import one_device_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
V = 512


def corpus_docs(n: int = 120) -> list[str]:
    """n distinct documents of varied length (pydoc prose, numbered)."""
    topics = embedded_corpus()
    return [f"doc {i}: " + topics[i % len(topics)][: 300 + 37 * i] for i in range(n)]


def write_jsonl(path, docs, opener=open, **extra) -> str:
    with opener(path, "wt") as f:
        for i, doc in enumerate(docs):
            f.write(json.dumps({"id": i, "text": doc, **extra}) + "\n")
    return str(path)


def write_zst(path, docs) -> str:
    lines = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    path.write_bytes(zstandard.ZstdCompressor().compress(lines))
    return str(path)


def write_parquet(path, docs, row_group_size: int = 16) -> str:
    table = pa.table({"id": list(range(len(docs))), "text": docs})
    pq.write_table(table, path, row_group_size=row_group_size)
    return str(path)


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tok") / "tok.model")
    train_tokenizer(embedded_corpus(), V, path)
    return path


def prepare(inp, out, tokenizer_path, **kw) -> dict:
    kw = {"workers": 1, "heldout_fraction": 0.1, "shard_tokens": 4000, "chunk_records": 7, **kw}
    return prepare_corpus(
        Options(input=str(inp), output=str(out), tokenizer_path=tokenizer_path, **kw)
    )


def shard_bytes(out, manifest) -> dict:
    files = [s["file"] for split in manifest["splits"].values() for s in split["shards"]]
    return {f: (out / f).read_bytes() for f in files}


def split_documents(out, manifest, split: str, tokenizer) -> list[str]:
    """The documents of a split, cut at the eos separators the manifest names."""
    files = [out / s["file"] for s in manifest["splits"][split]["shards"]]
    tokens = np.concatenate([np.fromfile(f, manifest["dtype"]) for f in files])
    eos = manifest["document_separator"]["id"]
    assert tokens[-1] == eos
    ends = np.flatnonzero(tokens == eos)
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [tokenizer.decode(tokens[a:b]) for a, b in zip(starts, ends, strict=True)]


def test_all_formats_give_the_same_shards(tmp_path, tokenizer_path):
    docs = corpus_docs(60)
    inputs = {
        "jsonl": write_jsonl(tmp_path / "c.jsonl", docs),
        "gz": write_jsonl(tmp_path / "c.jsonl.gz", docs, opener=gzip.open),
        "zst": write_zst(tmp_path / "c.jsonl.zst", docs),
        "parquet": write_parquet(tmp_path / "c.parquet", docs),
    }
    results = {}
    for name, path in inputs.items():
        out = tmp_path / f"out_{name}"
        results[name] = shard_bytes(out, prepare(path, out, tokenizer_path))
    assert len(results["jsonl"]) > 3  # several shards per split
    for name in inputs:
        assert results[name] == results["jsonl"], name


def test_same_bytes_whatever_the_worker_count(tmp_path, tokenizer_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    docs = corpus_docs(150)
    write_jsonl(corpus / "a.jsonl", docs[:70])
    write_parquet(corpus / "b.parquet", docs[70:])
    one = prepare(corpus, tmp_path / "w1", tokenizer_path, workers=1)
    two = prepare(corpus, tmp_path / "w2", tokenizer_path, workers=2, chunk_records=3)
    assert one["splits"]["train"]["documents"] + one["splits"]["heldout"]["documents"] == 150
    assert shard_bytes(tmp_path / "w1", one) == shard_bytes(tmp_path / "w2", two)
    assert {**one, "command": ""} == {**two, "command": ""}
    assert (tmp_path / "w1/tokenizer.model").read_bytes() == open(tokenizer_path, "rb").read()


def test_document_boundaries_and_heldout_split(tmp_path, tokenizer_path):
    docs = corpus_docs(80)
    path = write_jsonl(tmp_path / "c.jsonl", docs)
    with open(path, "a") as f:  # blank records are not documents
        f.write("\n" + json.dumps({"text": "  \n"}) + "\n")
    m = prepare(path, tmp_path / "out", tokenizer_path, heldout_fraction=0.25)
    tok = load_tokenizer(str(tmp_path / "out/tokenizer.model"))
    train = split_documents(tmp_path / "out", m, "train", tok)
    held = split_documents(tmp_path / "out", m, "heldout", tok)
    assert 5 < len(held) < 40 and len(train) + len(held) == 80 == m["documents"]
    assert sorted(train + held) == sorted(docs) and not set(train) & set(held)
    assert train == [d for d in docs if d in set(train)]  # reading order kept
    for split, got in (("train", train), ("heldout", held)):
        shards = m["splits"][split]["shards"]
        assert sum(s["documents"] for s in shards) == len(got) == m["splits"][split]["documents"]
        assert all(s["tokens"] == 4000 for s in shards[:-1])
    other = prepare(path, tmp_path / "seed1", tokenizer_path, heldout_fraction=0.25, seed=1)
    assert split_documents(tmp_path / "seed1", other, "heldout", tok) != held


def test_heldout_docs_takes_the_first_documents(tmp_path, tokenizer_path):
    docs = corpus_docs(30)
    path = write_jsonl(tmp_path / "c.jsonl", docs)
    m = prepare(path, tmp_path / "out", tokenizer_path, heldout_fraction=None, heldout_docs=4)
    assert m["settings"]["heldout_fraction"] == 0.0  # the default fraction gives way
    tok = load_tokenizer(tokenizer_path)
    assert split_documents(tmp_path / "out", m, "heldout", tok) == docs[:4]
    assert split_documents(tmp_path / "out", m, "train", tok) == docs[4:]


def test_tokenizer_sample_is_bounded_and_has_no_heldout_document(tmp_path):
    docs = corpus_docs(50)
    path = write_jsonl(tmp_path / "c.jsonl", docs)
    o = Options(input=path, output="", vocab_size=V, tokenizer_sample_docs=20, heldout_docs=6)
    assert training_sample(o, open_source(path)) == docs[6:26]
    o = Options(input=path, output="", vocab_size=V, tokenizer_sample_docs=1000)
    o.heldout_fraction = 0.3
    sample = training_sample(o, open_source(path))
    assert 20 < len(sample) < 50 and sample == [d for d in docs if d in set(sample)]


def test_document_difficulty_is_leave_one_out_word_surprisal(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", ["a a b", "b c", " ", "!"])
    numbers, difficulty = document_difficulty(open_source(path), "text")
    # corpus counts a 2, b 2, c 1, ! 1: 6 words, 4 kinds + the unseen one; each document is
    # scored by add-one counts of the others (its own words removed).
    expected = [
        np.log(6 - 3 + 5) - np.log(2) / 3,  # a: 2-2+1, a: again, b: 2-1+1
        np.log(6 - 2 + 5) - np.log(2) / 2,  # b: 2-1+1, c: 1-1+1
        np.log(6 - 1 + 5),  # !: 1-1+1
    ]
    assert numbers.tolist() == [0, 1, 3]  # the blank record 2 is no document
    np.testing.assert_allclose(difficulty, expected, rtol=1e-12)


@pytest.mark.parametrize("fraction", [0.1, 0.3])
def test_stratified_choice_takes_one_document_of_every_difficulty_stratum(fraction):
    rng = np.random.default_rng(0)
    numbers = np.arange(1000, 1095)
    difficulty = rng.permutation(95).astype(float)  # document numbers[i] has rank difficulty[i]
    chosen = stratified_records(numbers, difficulty, fraction, seed=3)
    ranks = np.sort(difficulty[np.isin(numbers, chosen)].astype(int))
    k = np.arange(len(ranks))
    starts = np.ceil(np.round(k / fraction, 6))  # stratum k: ranks [ceil(k/p), ceil((k+1)/p))
    ends = np.ceil(np.round((k + 1) / fraction, 6))
    assert np.all((starts <= ranks) & (ranks < ends))  # one per stratum, none skipped
    whole = int(95 * fraction)  # strata wholly within the 95 ranks give one each; the last,
    assert len(chosen) in (whole, whole + 1)  # cut short, gives one or none
    assert np.array_equal(chosen, stratified_records(numbers, difficulty, fraction, seed=3))
    assert not np.array_equal(chosen, stratified_records(numbers, difficulty, fraction, seed=4))


def test_stratified_heldout_split_is_as_hard_as_the_training_split(tmp_path, tokenizer_path):
    rng = np.random.default_rng(0)
    easy = ["the cat sat on the mat. " * 12 + "the end." for _ in range(20)]
    prose = corpus_docs(40)  # pydoc prose: harder than the cat, easier than noise
    noise = [" ".join(f"q{rng.integers(1 << 40):x}" for _ in range(60)) for _ in range(20)]
    docs = easy[:10] + prose[:20] + noise[:10] + easy[10:] + prose[20:] + noise[10:]
    path = write_jsonl(tmp_path / "c.jsonl", docs)
    out = tmp_path / "out"
    m = prepare(path, out, tokenizer_path, heldout_fraction=0.25, heldout_stratified=True)
    assert m["settings"]["heldout_stratified"] is True
    tok = load_tokenizer(tokenizer_path)
    held = split_documents(out, m, "heldout", tok)
    # 80 documents ranked by difficulty: easy 0-19, prose 20-59, noise 60-79; strata of 4.
    kinds = [sum(d in set(group) for d in held) for group in (easy, prose, noise)]
    assert kinds == [5, 10, 5]
    train = split_documents(out, m, "train", tok)
    assert sorted(train + held) == sorted(docs) and len(train) == 60
    o = Options(input=path, output="", vocab_size=V, heldout_fraction=0.25)
    o.heldout_stratified = True
    sample = training_sample(o, open_source(path))
    assert sorted(sample) == sorted(train)  # the tokenizer never reads a held-out document


def test_trained_tokenizer_is_saved_and_named_in_the_manifest(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", corpus_docs(80))
    out = tmp_path / "out"
    m = prepare(path, out, None, vocab_size=400, tokenizer_sample_docs=40)
    tok = load_tokenizer(str(out / "tokenizer.model"))
    assert tok.vocab_size == 400 and m["tokenizer"]["vocab_size"] == 400
    assert "first 40 training documents" in m["tokenizer"]["origin"]


class TinyPrepareText(tfds.core.GeneratorBasedBuilder):
    """A tfds text dataset built offline in the test (array_record, read by index)."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        features = tfds.features.FeaturesDict({"text": tfds.features.Text()})
        return tfds.core.DatasetInfo(builder=self, features=features)

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i, doc in enumerate(corpus_docs(30)):
            yield i, {"text": doc}


def test_tfds_and_txt_inputs(tmp_path, tokenizer_path, system_temp_in_tmp_path):
    tfds.disable_progress_bar()
    TinyPrepareText(
        data_dir=str(tmp_path / "tfds"), file_format="array_record"
    ).download_and_prepare()
    inp = "tfds:tiny_prepare_text:train"
    m = prepare(inp, tmp_path / "out", tokenizer_path, data_dir=str(tmp_path / "tfds"))
    tok = load_tokenizer(tokenizer_path)
    got = split_documents(tmp_path / "out", m, "train", tok)
    got += split_documents(tmp_path / "out", m, "heldout", tok)
    assert sorted(got) == sorted(corpus_docs(30)) and m["source"]["examples"] == 30
    texts = tmp_path / "texts"
    (texts / "sub").mkdir(parents=True)
    for name, doc in (
        ("b.txt", "second file\n"),
        ("a.txt", "first file\n"),
        ("sub/c.txt", "third"),
    ):
        (texts / name).write_text(doc)
    m = prepare(texts, tmp_path / "txt", tokenizer_path, heldout_fraction=0.0)
    got = split_documents(tmp_path / "txt", m, "train", tok)
    assert got == ["first file\n", "second file\n", "third"]


def test_each_host_reads_its_rows_of_prepared_shards(tmp_path, tokenizer_path):
    prepare(write_jsonl(tmp_path / "c.jsonl", corpus_docs(60)), tmp_path / "out", tokenizer_path)
    spec, geometry = f"bin:{tmp_path / 'out'}", dict(vocab_size=V, seq_len=16, batch_size=4)
    whole = next(build_data(spec, **geometry).train)
    halves = [
        next(build_data(spec, **geometry, process_index=p, process_count=2).train) for p in (0, 1)
    ]
    np.testing.assert_array_equal(np.concatenate(halves), whole)


def test_ordered_map_keeps_order_and_reads_a_bounded_number_of_chunks_ahead():
    pulled = []

    def items():
        for i in range(60):
            pulled.append(i)
            yield -i

    got = []
    for value in ordered_map(abs, items(), 2, int, (), in_flight=4):
        got.append(value)
        assert len(pulled) <= len(got) + 4  # streaming: memory does not grow with the input
    assert got == list(range(60))


def test_the_tokenizing_worker_imports_neither_jax_nor_grain():
    """Each spawned worker imports `encode`; with JAX and Grain on that path every worker
    pays seconds of imports, and extra workers barely speed tokenizing up."""
    code = (
        "import sys, gpn_jax.data.prepare.encode as e; "
        "print(sorted(m for m in ('jax', 'grain', 'tensorflow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_option_errors():
    for kw, msg in (
        (dict(vocab_size=V, heldout_docs=3, heldout_fraction=0.1), "not both"),
        (dict(vocab_size=V, tokenizer_path="x.model"), "exactly one"),
        (dict(), "exactly one"),
        (dict(vocab_size=V, heldout_fraction=1.0), "heldout_fraction"),
        (dict(vocab_size=V, shard_tokens=0), "shard_tokens"),
        (dict(vocab_size=V, heldout_docs=3, heldout_stratified=True), "needs --heldout_fraction"),
    ):
        with pytest.raises(ValueError, match=msg):
            check_options(Options(input="x", output="y", **kw))
    o = Options(input="x", output="y", vocab_size=V)
    check_options(o)
    assert o.heldout_fraction == 0.001


def test_output_that_is_a_file_fails_before_reading_the_input(tmp_path):
    """Issue 45 items 4 and 7: `--output` naming a file is one line, before any input is read
    (the input here does not exist, so the --output error shows it came first)."""
    blocker = tmp_path / "a_file"
    blocker.write_text("keep me")
    for output in (blocker, blocker / "sub"):
        with pytest.raises(ValueError, match=f"--output={output}.* is a file, not a directory"):
            check_options(
                Options(input=str(tmp_path / "missing"), output=str(output), vocab_size=V)
            )
    proc = subprocess.run(
        [sys.executable, "-m", "gpn_jax.prepare", f"--input={tmp_path / 'missing'}",
         f"--output={blocker}", f"--vocab_size={V}"],
        capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
    )  # fmt: skip
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "gpn-prepare: error: --output=" in proc.stderr and blocker.read_text() == "keep me"


def test_uint32_shards_for_a_vocabulary_over_65536(tmp_path, tokenizer_path):
    """The test tokenizer grown to 70,000 pieces; the last, 'doc', starts every document."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    model = pb.ModelProto()
    model.ParseFromString(open(tokenizer_path, "rb").read())
    for i in range(70_000 - len(model.pieces)):
        piece = model.pieces.add()
        piece.piece = "doc" if i == 70_000 - V - 1 else f"<unused_{i}>"
        piece.type = pb.ModelProto.SentencePiece.USER_DEFINED
    big = tmp_path / "big.model"
    big.write_bytes(model.SerializeToString())
    docs = corpus_docs(30)
    m = prepare(write_jsonl(tmp_path / "c.jsonl", docs), tmp_path / "out", str(big))
    tok = load_tokenizer(str(big))
    assert m["dtype"] == "uint32" and tok.encode("doc 1")[0] == 69_999
    got = split_documents(tmp_path / "out", m, "train", tok)
    got += split_documents(tmp_path / "out", m, "heldout", tok)
    assert sorted(got) == sorted(docs)
    data = build_data(f"bin:{tmp_path / 'out'}", vocab_size=70_000, seq_len=16, batch_size=4)
    assert data.train_tokens.dtype == np.uint32 and int(data.train_tokens[:].max()) == 69_999


def test_token_dtype():
    assert token_dtype(32_000) == "uint16" and token_dtype(65_536) == "uint16"
    assert token_dtype(65_537) == "uint32" and token_dtype(128_256) == "uint32"


def test_bin_training_reads_prepared_shards_heldout_and_tokenizer(tmp_path, tokenizer_path):
    docs = corpus_docs(120)
    m = prepare(write_jsonl(tmp_path / "c.jsonl", docs), tmp_path / "out", tokenizer_path)
    workdir = tmp_path / "run"
    data = build_data(
        f"bin:{tmp_path / 'out'}", vocab_size=V, seq_len=16, batch_size=4, workdir=str(workdir)
    )
    shards = {
        s: np.concatenate(
            [np.fromfile(tmp_path / "out" / x["file"], np.uint16) for x in v["shards"]]
        )
        for s, v in m["splits"].items()
    }
    np.testing.assert_array_equal(data.train_tokens[:], shards["train"])
    np.testing.assert_array_equal(data.heldout[:], shards["heldout"])
    assert data.tokenizer.vocab_size == V and data.eos_id == m["document_separator"]["id"]
    assert (workdir / "tokenizer.model").read_bytes() == open(tokenizer_path, "rb").read()
    assert data.unigram_counts.sum() == len(shards["train"])
    batch = next(data.train)
    assert batch.shape == (4, 16) and batch.dtype == np.int32


def test_bin_training_without_heldout_shards_splits_by_position(tmp_path, tokenizer_path):
    path = write_jsonl(tmp_path / "c.jsonl", corpus_docs(60))
    m = prepare(path, tmp_path / "out", tokenizer_path, heldout_fraction=0.0)
    assert m["splits"]["heldout"] == {"shards": [], "tokens": 0, "documents": 0}
    data = build_data(f"bin:{tmp_path / 'out'}", vocab_size=V, seq_len=16, batch_size=4)
    total = m["splits"]["train"]["tokens"]
    assert (
        len(data.heldout) == round(total * 0.05)
        and len(data.train_tokens) + len(data.heldout) == total
    )


def test_bin_training_refuses_a_tokenizer_other_than_the_corpus(tmp_path, tokenizer_path):
    prepare(write_jsonl(tmp_path / "c.jsonl", corpus_docs(60)), tmp_path / "out", tokenizer_path)
    other = str(tmp_path / "other.model")
    train_tokenizer(corpus_docs(40), V, other)
    spec, geometry = f"bin:{tmp_path / 'out'}", dict(vocab_size=V, seq_len=16, batch_size=4)
    with pytest.raises(ValueError, match="is not the one .* was prepared with"):
        build_data(spec, tokenizer_path=other, **geometry)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "tokenizer.model").write_bytes(open(other, "rb").read())
    with pytest.raises(ValueError, match="is not the tokenizer of"):
        build_data(spec, workdir=str(tmp_path / "run"), **geometry)


def test_rerun_of_a_finished_output_does_nothing(tmp_path, tokenizer_path):
    path = write_jsonl(tmp_path / "c.jsonl", corpus_docs(40))
    out = tmp_path / "out"
    prepare(path, out, tokenizer_path)

    def times():  # the output's lock file (`io.lock`) is written by every run: not output
        return {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.name != ".gpn_jax.lock"}

    before = times()
    prepare(path, out, tokenizer_path, workers=2)  # --workers does not change the output
    assert times() == before


def cli(*args, env=None, cwd=ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
    cmd = [sys.executable, "-m", "gpn_jax.prepare", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("stratified", [False, True])
def test_killed_prepare_resumes_to_the_same_bytes(tmp_path, tokenizer_path, stratified):
    docs = corpus_docs(120)
    path = write_jsonl(tmp_path / "c.jsonl", docs)
    reference = prepare(path, tmp_path / "ref", tokenizer_path, heldout_stratified=stratified)
    out = tmp_path / "out"
    args = [f"--input={path}", f"--output={out}", f"--tokenizer_path={tokenizer_path}"]
    args += ["--heldout_stratified"] * stratified
    args += ["--heldout_fraction=0.1", "--shard_tokens=4000", "--chunk_records=7", "--workers=1"]
    killed = cli(*args, env={KILL_AFTER_SHARDS_ENV: "5"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (out / "progress.json").exists() and not (out / "manifest.json").exists()
    finished = sorted(out.glob("*/data_*.bin"))
    assert len(finished) == 5
    stamps = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in finished[:-1]}
    partial = next(out.glob("*/*.partial"))
    with open(partial, "ab") as f:  # bytes written after the last progress save
        f.write(b"\x07" * 100)
    resumed = cli(*args[:-1], "--workers=2")  # the worker count may change: same bytes
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert resumed.stdout.strip().splitlines()[-1].startswith("prepared 120 documents")
    manifest = json.loads((out / "manifest.json").read_text())
    assert shard_bytes(out, manifest) == shard_bytes(tmp_path / "ref", reference)
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in stamps} == stamps  # not redone
    assert not (out / "progress.json").exists() and not list(out.glob("*/*.partial"))
    assert manifest["command"].startswith("python -m gpn_jax.prepare --input=")


def _corrupt_zst(tmp_path):
    (tmp_path / "c.jsonl.zst").write_bytes(b"this is not zstandard data" * 10)
    return str(tmp_path / "c.jsonl.zst"), "cannot read", "text"


def _malformed_line(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", corpus_docs(5))
    with open(path, "a") as f:
        f.write('{"text": "unterminated\n')
    return path, "c.jsonl:6: malformed JSON line", "text"


def _missing_field(tmp_path):
    return (
        write_jsonl(tmp_path / "c.jsonl", corpus_docs(3)),
        "c.jsonl:1: no string field 'body'",
        "body",
    )


def _missing_column(tmp_path):
    return write_parquet(tmp_path / "c.parquet", corpus_docs(3)), "no column 'body'", "body"


def _empty(tmp_path):
    (tmp_path / "c.jsonl").write_text("\n\n" + json.dumps({"text": " "}) + "\n")
    return str(tmp_path / "c.jsonl"), "empty corpus", "text"


def _missing_file(tmp_path):
    return str(tmp_path / "nope.jsonl"), "input not found", "text"


@pytest.mark.parametrize(
    "make", [_corrupt_zst, _malformed_line, _missing_field, _missing_column, _empty, _missing_file]
)
def test_bad_input_is_one_line_and_no_manifest(tmp_path, tokenizer_path, make):
    inp, expected, field = make(tmp_path)
    out = tmp_path / "out"
    args = [f"--input={inp}", f"--output={out}", f"--tokenizer_path={tokenizer_path}"]
    proc = cli(*args, f"--text_field={field}", "--workers=1")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith("gpn-prepare: error: ") and proc.stderr.count("\n") == 1
    assert expected in proc.stderr, proc.stderr
    assert not (out / "manifest.json").exists()


def test_stratified_without_a_fraction_is_one_line(tmp_path, tokenizer_path):
    inp = write_jsonl(tmp_path / "c.jsonl", corpus_docs(5))
    args = [f"--input={inp}", f"--output={tmp_path / 'out'}", f"--tokenizer_path={tokenizer_path}"]
    proc = cli(*args, "--heldout_stratified", "--heldout_docs=2")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert "--heldout_stratified needs --heldout_fraction > 0" in proc.stderr


def test_output_holding_another_corpus_is_refused(tmp_path, tokenizer_path):
    out = tmp_path / "out"
    first = write_jsonl(tmp_path / "a.jsonl", corpus_docs(40))
    prepare(first, out, tokenizer_path)
    manifest = (out / "manifest.json").read_bytes()
    other_tok = str(tmp_path / "other.model")
    train_tokenizer(corpus_docs(40), 400, other_tok)
    other = write_jsonl(tmp_path / "b.jsonl", corpus_docs(10))
    same = ["--heldout_fraction=0.1", "--shard_tokens=4000", f"--output={out}"]
    for inp, tok, what in ((other, tokenizer_path, "source"), (first, other_tok, "tokenizer")):
        proc = cli(f"--input={inp}", f"--tokenizer_path={tok}", *same)
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
        assert f"holds another corpus's shards (different {what})" in proc.stderr, proc.stderr
    assert (out / "manifest.json").read_bytes() == manifest


def test_output_holding_shards_of_another_tool_is_refused(tmp_path, tokenizer_path):
    other = write_jsonl(tmp_path / "b.jsonl", corpus_docs(10))
    plain = tmp_path / "plain"
    (plain / "train").mkdir(parents=True)
    np.arange(10, dtype=np.uint16).tofile(plain / "train" / "data_0000.bin")
    proc = cli(f"--input={other}", f"--output={plain}", f"--tokenizer_path={tokenizer_path}")
    assert proc.returncode == 1 and "did not write" in proc.stderr, proc.stderr[-2000:]


def user_env() -> dict:
    """A user's shell: one CPU device (not the test's forced devices)."""
    return one_device_env(PYTHONPATH=ROOT)


def run_module(module: str, *args) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", module, *args]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=user_env(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, (module, proc.stderr[-3000:])
    return proc


@pytest.mark.slow
def test_parquet_and_jsonl_zst_to_training_and_evaluation(tmp_path):
    """The README recipe in small: gpn-prepare (trained tokenizer, 2 workers) -> train on
    bin:<dir> -> evaluate held-out PPL. (A bin: run's resume: tests/training/test_init_from.py's
    test_a_preempted_continued_run_resumes_from_its_own_checkpoint; the CLI's:
    tests/entry_points/test_train_cli.py's test_sigterm_saves_and_exits_cleanly_then_resumes.)"""
    corpus, out, run = tmp_path / "corpus", tmp_path / "prepared", tmp_path / "run"
    corpus.mkdir()
    docs = corpus_docs(200)
    write_parquet(corpus / "part_0.parquet", docs[:100])
    write_zst(corpus / "part_1.jsonl.zst", docs[100:])
    run_module(
        "gpn_jax.prepare",
        f"--input={corpus}",
        f"--output={out}",
        f"--vocab_size={V}",
        "--tokenizer_sample_docs=150",
        "--heldout_fraction=0.1",
        "--workers=2",
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["documents"] == 200 and manifest["dtype"] == "uint16"
    train = [
        "--config=experiments/configs/gpn_m_tiny.py",
        f"--workdir={run}",
        f"--config.data.source=bin:{out}",
        "--config.train.checkpoint_every=2",
        "--config.train.eval_every=0",
        "--config.train.final_eval_batches=2",
    ]
    proc = run_module("gpn_jax.train", *train, "--config.train.steps=4")
    assert "prepared, 1 train + 1 held-out uint16 shard(s)" in proc.stderr  # the run's log
    final = json.loads((run / "final_metrics.json").read_text())
    assert final["step"] == 4
    assert (run / "tokenizer.model").read_bytes() == (out / "tokenizer.model").read_bytes()
    results_file = tmp_path / "eval.json"  # evaluate never writes into the workdir
    run_module("gpn_jax.evaluate", f"--workdir={run}", "--eval=ppl", "--ppl_max_batches=2",
               f"--out={results_file}")  # fmt: skip
    results = json.loads(results_file.read_text())
    assert results["ppl"]["tokens"] == 2 * 4 * 32 and np.isfinite(results["ppl"]["ppl"])
