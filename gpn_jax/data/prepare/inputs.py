"""The documents of a corpus, read as raw record chunks from a resumable position.

Inputs: a file, a directory (searched recursively) or a glob of `.txt` (one document per
file), `.jsonl` / `.jsonl.gz` / `.jsonl.zst` (one JSON object per line) and `.parquet` (one
row per document, the text column read in record batches), or `tfds:NAME[/CONFIG][:SPLIT]`.
A record is a line, a row, a file or an example; records are numbered across the whole
corpus in reading order (files sorted by path) and that number identifies a document.
JSON is parsed by the tokenizing workers (`encode`), so reading stays cheap here.
"""

import dataclasses
import glob
import gzip
import io
import os
from collections.abc import Iterator

from gpn_jax.data.spec import parse_spec
from gpn_jax.io.regular import bounded_lines, open_regular, read_text

SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet")


@dataclasses.dataclass(frozen=True)
class Position:
    """Where reading resumes: file `file` (index), its record `offset`, corpus record `record`."""

    file: int = 0
    offset: int = 0
    record: int = 0


@dataclasses.dataclass
class Chunk:
    """Consecutive records of one file. `kind` 'jsonl': raw lines (bytes); 'text': strings."""

    kind: str
    path: str
    first_line: int  # 1-based line / row / example number of items[0] in its file
    items: list
    first_record: int  # corpus-wide record number of items[0]
    end: Position  # the position just after this chunk


def resolve_files(pattern: str) -> list[str]:
    """The corpus files of a file, directory or glob, sorted; a one-line ValueError if none."""
    if os.path.isdir(pattern):
        found = [os.path.join(r, n) for r, _, names in os.walk(pattern) for n in names]
        files = sorted(f for f in found if f.endswith(SUFFIXES))
    elif os.path.exists(pattern):
        files = [pattern]
    elif glob.has_magic(pattern):
        files = sorted(f for f in glob.glob(pattern, recursive=True) if os.path.isfile(f))
    else:
        raise ValueError(f"input not found: {pattern}")
    bad = [f for f in files if not f.endswith(SUFFIXES)]
    if bad:
        raise ValueError(f"unsupported input file {bad[0]}; expected one of {', '.join(SUFFIXES)}")
    if not files:
        raise ValueError(f"no {'/'.join(SUFFIXES)} files in {pattern}")
    return files


class FileSource:
    """Records of a list of corpus files."""

    def __init__(self, spec: str, text_field: str):
        self.spec, self.text_field = spec, text_field
        self.files = resolve_files(spec)

    def describe(self) -> dict:
        return {"input": self.spec, "files": [os.path.abspath(f) for f in self.files]}

    def chunks(self, start: Position, size: int) -> Iterator[Chunk]:
        record = start.record
        for index in range(start.file, len(self.files)):
            path = self.files[index]
            offset = start.offset if index == start.file else 0
            for chunk in _file_chunks(path, self.text_field, offset, size, index, record):
                record = chunk.end.record
                yield chunk


def _file_chunks(path, text_field, offset, size, index, record) -> Iterator[Chunk]:
    kind = "text" if path.endswith((".txt", ".parquet")) else "jsonl"
    try:
        for first, items in _read_batches(path, text_field, offset, size):
            record += len(items)
            end = Position(index, first - 1 + len(items), record)
            yield Chunk(kind, path, first, items, record - len(items), end)
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {path}: {_reason(e)}") from None
    except Exception as e:  # zstandard / pyarrow raise their own error types
        if type(e).__module__.split(".")[0] not in ("zstandard", "pyarrow"):
            raise
        raise ValueError(f"cannot read {path}: {_reason(e)}") from None


def _reason(e: Exception) -> str:
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return text.strip().splitlines()[0]


def _read_batches(path, text_field, offset, size) -> Iterator[tuple[int, list]]:
    """(1-based number of the first item, items) batches of `path` from item `offset`."""
    if path.endswith(".parquet"):
        yield from _parquet_batches(path, text_field, offset, size)
    elif path.endswith(".txt"):
        if offset == 0:
            yield 1, [read_text(path)]
    else:
        with _open_lines(path) as f:
            yield from _line_batches(bounded_lines(f, path), offset, size)


def _open_lines(path: str):
    raw, _ = open_regular(path)  # a FIFO or device is refused, not read
    if path.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if path.endswith(".zst"):
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
    return raw


def _line_batches(lines, offset: int, size: int) -> Iterator[tuple[int, list]]:
    batch, number = [], 0
    for number, line in enumerate(lines, start=1):
        if number <= offset:
            continue
        batch.append(line)
        if len(batch) == size:
            yield number - size + 1, batch
            batch = []
    if batch:
        yield number - len(batch) + 1, batch


def _parquet_batches(path, text_field, offset, size) -> Iterator[tuple[int, list]]:
    import pyarrow.parquet as pq

    raw, _ = open_regular(path)  # a FIFO or device is refused, not handed to pyarrow
    with raw, pq.ParquetFile(raw) as pf:
        names = pf.schema_arrow.names
        if text_field not in names:
            raise ValueError(f"{path}: no column {text_field!r} (columns: {', '.join(names)})")
        row = 0
        for batch in pf.iter_batches(batch_size=size, columns=[text_field]):
            texts = batch.column(0).to_pylist()
            keep = texts[max(0, offset - row) :]
            if keep:
                yield row + len(texts) - len(keep) + 1, keep
            row += len(texts)


class TfdsSource:
    """Records (examples) of a tensorflow-datasets split, read by index (array_record)."""

    def __init__(self, spec: str, data_dir: str | None, text_field: str):
        from gpn_jax.data.tfds_source import open_tfds

        parsed = parse_spec(spec)
        self.spec, self.name, self.split = spec, parsed.name, parsed.split
        self.data_dir, self.text_field = data_dir, text_field
        self.source = open_tfds(parsed.name, parsed.split, data_dir)

    def describe(self) -> dict:
        return {"input": self.spec, "data_dir": self.data_dir, "examples": len(self.source)}

    def chunks(self, start: Position, size: int) -> Iterator[Chunk]:
        from gpn_jax.data.tfds_source import example_text

        for lo in range(start.offset, len(self.source), size):
            hi = min(len(self.source), lo + size)
            items = [
                _as_text(example_text(self.source[i], self.text_field, self.name), self.name)
                for i in range(lo, hi)
            ]
            yield Chunk("text", self.spec, lo + 1, items, lo, Position(0, hi, hi))


def _as_text(value, name: str) -> str:
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if not isinstance(value, str):
        raise ValueError(f"tfds dataset {name!r}: text feature is {type(value).__name__}")
    return value


def open_source(spec: str, data_dir: str | None = None, text_field: str = "text"):
    """A `FileSource` or `TfdsSource` for `spec`."""
    if not spec:
        raise ValueError("--input is required")
    if spec.startswith("tfds:"):
        return TfdsSource(spec, data_dir, text_field)
    return FileSource(spec, text_field)
