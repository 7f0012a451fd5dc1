"""Spec parsing and document sources: embedded, .txt/.jsonl files and dirs, tfds, .bin."""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds

from gpn_jax.data.bin_source import open_bin
from gpn_jax.data.sources import load_documents
from gpn_jax.data.spec import SourceSpec, parse_spec
from gpn_jax.data.split import split_documents
from gpn_jax.data.text_sources import embedded_corpus, iter_path_documents
from gpn_jax.data.tfds_source import iter_tfds_documents


@pytest.mark.parametrize(
    "spec, expected",
    [
        (None, SourceSpec("embedded")),
        ("embedded", SourceSpec("embedded")),
        ("tfds:lm1b", SourceSpec("tfds", name="lm1b")),
        ("tfds:c4/en:validation", SourceSpec("tfds", name="c4/en", split="validation")),
        ("tfds:c4/en:3.0.1", SourceSpec("tfds", name="c4/en:3.0.1")),
        ("tfds:c4/en:3.0.1:train[:1%]", SourceSpec("tfds", name="c4/en:3.0.1", split="train[:1%]")),
        ("tfds:lm1b:train[:100]", SourceSpec("tfds", name="lm1b", split="train[:100]")),
        ("bin:/d/fineweb", SourceSpec("bin", path="/d/fineweb")),
        ("text:/a/b.txt", SourceSpec("text", path="/a/b.txt")),
        ("/a/b.jsonl", SourceSpec("text", path="/a/b.jsonl")),
    ],
)
def test_parse_spec(spec, expected):
    assert parse_spec(spec) == expected


def test_unknown_spec_is_one_line_error():
    with pytest.raises(ValueError, match="unknown data spec 'hf:wiki'") as e:
        parse_spec("hf:wiki")
    assert "\n" not in str(e.value)


def test_embedded_corpus_is_sorted_pydoc_topics():
    from pydoc_data.topics import topics

    docs = embedded_corpus()
    assert docs == [topics[k] for k in sorted(topics)]
    assert sum(map(len, docs)) > 300_000


def test_directory_of_txt_and_jsonl_recursive_sorted(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "2.txt").write_text("two\nlines")
    (tmp_path / "a.jsonl").write_text('{"text": "one"}\n\n{"text": "uno", "id": 3}\n')
    (tmp_path / "c.txt").write_text("   \n")  # blank: no document
    (tmp_path / "skip.md").write_text("not read")
    assert list(iter_path_documents(str(tmp_path))) == ["one", "uno", "two\nlines"]


def test_jsonl_malformed_line_names_file_and_line(tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": "broken"\n')
    with pytest.raises(ValueError, match=r"x\.jsonl:2: malformed JSON"):
        list(iter_path_documents(str(bad)))
    bad.write_text('{"text": "ok"}\n\n{"body": "no text"}\n')
    with pytest.raises(ValueError, match=r"x\.jsonl:3: .*'text'"):
        list(iter_path_documents(str(bad)))


def test_missing_path_and_empty_corpus(tmp_path):
    with pytest.raises(ValueError, match="data path not found"):
        load_documents(parse_spec(str(tmp_path / "nope.txt")))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="empty corpus"):
        load_documents(parse_spec(str(tmp_path)))


def test_split_documents_is_disjoint_and_complete():
    docs = ["a" * 50, "line one\nline two\nline three\n", "z" * 10]
    train, held = split_documents(docs, 0.3)
    assert "".join(train) + "".join(held) == "".join(docs)
    assert train[-1].endswith("\n") and held[0] == "line three\n"
    assert split_documents(["one big doc"], 0.5) == (["one b"], ["ig doc"])
    assert split_documents(docs, 0.0) == (docs, [])


class TinyGpnText(tfds.core.GeneratorBasedBuilder):
    """A two-split text dataset built offline in the test."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        features = {"text": tfds.features.Text(), "label": tfds.features.Text()}
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(features))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(7), "test": self._generate_examples(2)}

    def _generate_examples(self, n):
        for i in range(n):
            yield i, {"text": f"document number {i} é", "label": f"L{i}"}


def test_tfds_array_record_round_trip(tmp_path, system_temp_in_tmp_path):
    tfds.disable_progress_bar()
    builder = TinyGpnText(data_dir=str(tmp_path), file_format="array_record")
    builder.download_and_prepare()
    docs = list(iter_tfds_documents(builder.name, "train", str(tmp_path)))
    assert sorted(docs) == sorted(f"document number {i} é" for i in range(7))
    assert docs == list(iter_tfds_documents(builder.name, "train", str(tmp_path)))
    labels = iter_tfds_documents(builder.name, "test", str(tmp_path), text_field="label")
    assert sorted(labels) == ["L0", "L1"]
    spec = parse_spec(f"tfds:{builder.name}:train[:3]")
    got, what = load_documents(spec, data_dir=str(tmp_path))
    assert got == docs[:3] and "3 docs" in what


def test_tfds_prepared_dataset_reads_without_its_builder_code(tmp_path, system_temp_in_tmp_path):
    """Like c4 / lm1b here: the builder class is not importable, only the prepared files."""
    tfds.disable_progress_bar()
    TinyGpnText(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
    code = (
        "from gpn_jax.data.tfds_source import iter_tfds_documents as f; "
        f"print(sorted(f('tiny_gpn_text', 'test', {str(tmp_path)!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['document number 0 é', 'document number 1 é']"


def test_tfds_unknown_dataset_is_one_line_error(tmp_path):
    with pytest.raises(ValueError, match="tfds dataset 'no_such_ds_xyz'.*tfds build") as e:
        list(iter_tfds_documents("no_such_ds_xyz", "train", str(tmp_path)))
    assert "\n" not in str(e.value)


def test_bin_shards_are_memmapped_and_concatenated(tmp_path):
    np.arange(0, 10, dtype=np.uint32).tofile(tmp_path / "data_0001.bin")
    np.arange(10, 13, dtype=np.uint32).tofile(tmp_path / "data_0002.bin")
    np.arange(100, 104, dtype=np.uint32).tofile(tmp_path / "data_0000.bin")
    (tmp_path / "other.bin").write_bytes(b"ignored when data_*.bin exist")
    tokens = open_bin(str(tmp_path), "uint32")
    assert len(tokens) == 17 and all(isinstance(a, np.memmap) for a in tokens._arrays)
    expected = np.r_[100:104, 0:13]
    np.testing.assert_array_equal(tokens[0:17], expected)
    np.testing.assert_array_equal(tokens[2:15], expected[2:15])
    view = tokens.view(5, 16)
    np.testing.assert_array_equal(view[3:9], expected[8:14])
    with pytest.raises(ValueError, match="bin_dtype"):
        open_bin(str(tmp_path), "int64")
