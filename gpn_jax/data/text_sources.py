"""Document sources from text: the embedded corpus, .txt/.jsonl files and directories."""

import json
import os
from collections.abc import Iterator

from gpn_jax.io.regular import bounded_lines, open_regular, read_text

TEXT_SUFFIXES = (".txt", ".jsonl")


def embedded_corpus() -> list[str]:
    """Python's pydoc topic texts (`pydoc_data.topics`), one document each, in sorted-key order.

    Real English prose and code shipped with every CPython, so it is always available offline.
    """
    from pydoc_data.topics import topics

    return [topics[key] for key in sorted(topics) if topics[key].strip()]


def iter_text_file(path: str) -> Iterator[str]:
    """Yields the whole file as one document (nothing if it is blank)."""
    text = read_text(path)  # a regular file of bounded size only
    if text.strip():
        yield text


def iter_jsonl_file(path: str, text_field: str = "text") -> Iterator[str]:
    """Yields `obj[text_field]` of every non-blank line; a bad line raises ValueError."""
    f, _ = open_regular(path)
    with f:
        for lineno, line in enumerate(bounded_lines(f, path), start=1):
            if line.strip():
                text = _jsonl_text(line.decode("utf-8"), text_field, path, lineno)
                if text.strip():
                    yield text


def _jsonl_text(line: str, text_field: str, path: str, lineno: int) -> str:
    # Safe on untrusted files: `json` builds only dicts, lists, strings and numbers.
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as e:
        msg = getattr(e, "msg", "nested too deeply")
        raise ValueError(f"{path}:{lineno}: malformed JSON line ({msg})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get(text_field), str):
        raise ValueError(
            f"{path}:{lineno}: expected a JSON object with a string {text_field!r} field"
        )
    return obj[text_field]


def list_text_files(path: str) -> list[str]:
    """`path` itself if it is a file, else its .txt/.jsonl files (recursive, sorted)."""
    if not os.path.exists(path):
        raise ValueError(f"data path not found: {path}")
    if os.path.isfile(path):
        return [path]
    found = [
        os.path.join(root, name)
        for root, _, names in os.walk(path)
        for name in names
        if name.endswith(TEXT_SUFFIXES)
    ]
    return sorted(found, key=lambda p: os.path.relpath(p, path).split(os.sep))


def iter_path_documents(path: str, text_field: str = "text") -> Iterator[str]:
    """Documents of a .txt/.jsonl file or of every such file under a directory."""
    for file in list_text_files(path):
        if file.endswith(".jsonl"):
            yield from iter_jsonl_file(file, text_field)
        else:
            yield from iter_text_file(file)
