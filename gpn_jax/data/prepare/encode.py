"""The tokenizing worker: a chunk of raw records -> token ids, an eos after each document.

Runs in worker processes (`parallel.ordered_map`); everything it does is a pure function of
the chunk, so the output bytes do not depend on how many workers there are.
"""

import itertools
import json

import numpy as np

from gpn_jax.data.tokenizer import Tokenizer, load_tokenizer

_STATE: dict = {}


def init_worker(tokenizer_path: str, text_field: str, dtype: str) -> None:
    """Loads the tokenizer once per worker process."""
    _STATE.update(tokenizer=load_tokenizer(tokenizer_path), text_field=text_field, dtype=dtype)


def chunk_texts(chunk, text_field: str) -> list[str]:
    """The document text of every record ('' for a blank one); bad JSON raises file:line."""
    if chunk.kind == "text":
        return [t if isinstance(t, str) else "" for t in chunk.items]
    return [
        _json_text(line, text_field, chunk.path, chunk.first_line + i)
        for i, line in enumerate(chunk.items)
    ]


def _json_text(line: bytes, text_field: str, path: str, lineno: int) -> str:
    if not line.strip():
        return ""
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        msg = getattr(e, "msg", None) or (
            "not UTF-8" if isinstance(e, UnicodeDecodeError) else "nested too deeply"
        )
        raise ValueError(f"{path}:{lineno}: malformed JSON line ({msg})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get(text_field), str):
        keys = ", ".join(sorted(obj)) if isinstance(obj, dict) else type(obj).__name__
        raise ValueError(
            f"{path}:{lineno}: no string field {text_field!r} (has: {keys}); set --text_field"
        )
    return obj[text_field]


def encode_chunk(chunk) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, lengths): each non-blank record's ids + eos, concatenated; lengths per record
    (0 for a blank record, which is not a document)."""
    tokenizer: Tokenizer = _STATE["tokenizer"]
    texts = chunk_texts(chunk, _STATE["text_field"])
    keep = [i for i, t in enumerate(texts) if t.strip()]
    ids = tokenizer.encode_batch([texts[i] for i in keep], num_threads=1)
    eos = tokenizer.eos_id
    lengths = np.zeros((len(texts),), np.int64)
    for i, doc in zip(keep, ids, strict=True):
        doc.append(eos)
        lengths[i] = len(doc)
    total = int(lengths.sum())
    tokens = np.fromiter(itertools.chain.from_iterable(ids), _STATE["dtype"], count=total)
    return tokens, lengths


def encode_task(chunk) -> tuple:
    """`encode_chunk` plus the chunk's first record number and end position (for the writer)."""
    tokens, lengths = encode_chunk(chunk)
    return chunk.first_record, chunk.end, tokens, lengths
