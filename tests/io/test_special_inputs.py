"""Readers take regular files of bounded size only (issue 83): a FIFO, a device or a directory
where a file belongs is a one-line error naming the path (never a hang or a read without end),
one document may not exceed its cap however it is stored, and JSON nested absurdly deep is a
malformed line, not a RecursionError."""

import os

import pytest

from gpn_jax.data.prepare import encode
from gpn_jax.data.prepare.inputs import FileSource, Position
from gpn_jax.data.text_sources import iter_jsonl_file, iter_path_documents
from gpn_jax.eval.lambada import read_lambada
from gpn_jax.eval.suite import check_results_file
from gpn_jax.io import regular
from gpn_jax.io.outputs import check_out_file

DEEP = "[" * 100_000 + "\n"


def _special(tmp_path, kind: str, name: str) -> str:
    """`name` in tmp_path as a FIFO, a link to /dev/zero or a directory."""
    path = tmp_path / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    return str(path)


def _chunks(spec: str) -> list:
    return list(FileSource(spec, "text").chunks(Position(), 64))


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_evaluate_out_must_be_a_regular_file(tmp_path, kind):
    out = _special(tmp_path, kind, "results.json")
    with pytest.raises(ValueError, match=f"--out={out} is a (FIFO|device), not a regular file"):
        check_out_file(out)
    with pytest.raises(ValueError, match="is not this run's results"):
        check_results_file(out, str(tmp_path / "run"), 1)  # read without blocking: refused


@pytest.mark.parametrize("kind", ["fifo", "zero", "directory"])
def test_lambada_and_stream_inputs_must_be_regular_files(tmp_path, kind):
    path = _special(tmp_path, kind, "lambada.jsonl")
    with pytest.raises((ValueError, OSError), match=path):
        read_lambada(path)
    with pytest.raises(OSError, match=path):
        regular.read_text(path, regular.MAX_TEXT_BYTES)  # what --stream_path is read with


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_special_file_in_a_prepare_input_folder_is_refused(tmp_path, kind):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"text": "fine"}\n')
    path = _special(tmp_path / "in", kind, "b.txt")
    with pytest.raises(ValueError, match=f"cannot read {path}: .*(FIFO|device)"):
        _chunks(str(tmp_path / "in"))
    with pytest.raises(OSError, match=path):
        list(iter_path_documents(str(tmp_path / "in")))


def test_one_jsonl_document_past_the_cap_is_refused_without_reading_it_whole(tmp_path):
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"text": "' + b"x" * (regular.MAX_DOCUMENT_BYTES + 16) + b'"}\n')
    with pytest.raises(ValueError, match=f"{path}: line 1 is more than"):
        _chunks(str(path))
    with pytest.raises(ValueError, match="line 1 is more than"):
        list(iter_jsonl_file(str(path)))


def test_bounded_lines_reads_lines_up_to_the_cap(tmp_path):
    path = tmp_path / "lines"
    path.write_bytes(b"abc\nde\n")
    with open(path, "rb") as f:
        assert list(regular.bounded_lines(f, path, 4)) == [b"abc\n", b"de\n"]
    path.write_bytes(b"abc\nde\n" + b"f" * 9)
    with open(path, "rb") as f, pytest.raises(ValueError, match="line 3 is more than 4 bytes"):
        list(regular.bounded_lines(f, path, 4))


def test_deeply_nested_json_lines_are_malformed_lines(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text(DEEP)
    with pytest.raises(ValueError, match=f"{path}:1: malformed JSON line"):
        encode._json_text(DEEP.encode(), "text", str(path), 1)
    with pytest.raises(ValueError, match=f"{path}:1: malformed JSON line"):
        list(iter_jsonl_file(str(path)))
    with pytest.raises(ValueError, match=f"{path} line 1: not valid JSON"):
        read_lambada(str(path))
