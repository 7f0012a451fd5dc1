"""Fixed-size token shards written atomically and resumably.

A split's shards are `<dir>/data_0000.bin`, `data_0001.bin`, ... (raw little-endian tokens,
no header: the paper code's layout), each exactly `shard_tokens` long except the last.
Tokens are appended to `data_NNNN.bin.partial`; a full shard is renamed into place
(`os.replace`). `state()` (saved by the caller after every chunk) records the finished
shards and the partial shard's length; `ShardWriter(..., state)` reconciles the directory
with it after a kill: extra bytes are cut off, shards finished after the state was saved
are reopened, later files removed, so the rerun rewrites the same bytes.
"""

import os
import re

import numpy as np

from gpn_jax.io.regular import open_for_writing

_SHARD = re.compile(r"^data_(\d{4,})\.bin(\.partial)?$")


def shard_name(index: int) -> str:
    return f"data_{index:04d}.bin"


class ShardWriter:
    """Appends tokens of one split to its shard directory."""

    def __init__(self, directory: str, dtype: str, shard_tokens: int, eos_id: int, state=None):
        self.directory, self.dtype = directory, np.dtype(dtype)
        self.shard_tokens, self.eos_id = shard_tokens, eos_id
        state = state or {"shards": [], "pending_tokens": 0, "pending_documents": 0}
        self.shards = [dict(s) for s in state["shards"]]
        self.pending, self.pending_docs = state["pending_tokens"], state["pending_documents"]
        os.makedirs(directory, exist_ok=True)
        self._reconcile()
        self._file = open_for_writing(self._partial(), append=True)

    def _path(self, index: int) -> str:
        return os.path.join(self.directory, shard_name(index))

    def _partial(self) -> str:
        return self._path(len(self.shards)) + ".partial"

    def _reconcile(self) -> None:
        size = self.dtype.itemsize
        for i, shard in enumerate(self.shards):
            _settle(self._path(i), self._path(i) + ".partial", shard["tokens"] * size, final=True)
        current = len(self.shards)
        _settle(self._path(current), self._partial(), self.pending * size, final=False)
        for name in os.listdir(self.directory):
            m = _SHARD.match(name)
            index, partial = (int(m.group(1)), bool(m.group(2))) if m else (None, None)
            keep = index is None or (index < current and not partial)
            if not keep and not (index == current and partial):
                os.remove(os.path.join(self.directory, name))

    def append(self, tokens: np.ndarray) -> list[str]:
        """Writes `tokens`; returns the names of the shards this completed."""
        done = []
        while len(tokens):
            take = tokens[: self.shard_tokens - self.pending]
            self._file.write(take.astype(self.dtype, copy=False).tobytes())
            self.pending += len(take)
            self.pending_docs += int(np.count_nonzero(take == self.eos_id))
            tokens = tokens[len(take) :]
            if self.pending == self.shard_tokens:
                done.append(self._close_shard())
        return done

    def _close_shard(self) -> str:
        self._file.close()
        name = shard_name(len(self.shards))
        os.replace(self._partial(), self._path(len(self.shards)))
        self.shards.append({"file": name, "tokens": self.pending, "documents": self.pending_docs})
        self.pending = self.pending_docs = 0
        self._file = open_for_writing(self._partial(), append=True)
        return name

    def flush(self) -> None:
        """Makes every appended byte visible in the file (call before saving `state()`)."""
        self._file.flush()

    def state(self) -> dict:
        return {
            "shards": [dict(s) for s in self.shards],
            "pending_tokens": self.pending,
            "pending_documents": self.pending_docs,
        }

    def finish(self) -> list[dict]:
        """Closes the last, shorter shard (if any) and returns every shard's record."""
        if self.pending:
            self._close_shard()
        self._file.close()
        os.remove(self._partial())
        return self.shards


def _settle(final_path: str, partial_path: str, nbytes: int, final: bool) -> None:
    """Makes `final_path` (final) or `partial_path` (not final) hold exactly `nbytes` bytes,
    taking them from whichever of the two files has them."""
    want, other = (final_path, partial_path) if final else (partial_path, final_path)
    for source in (want, other):
        if os.path.exists(source) and os.path.getsize(source) >= nbytes:
            if source != want:
                os.replace(source, want)
            if os.path.getsize(want) > nbytes:  # a finished shard stays untouched
                with open_for_writing(want, append=True) as f:  # this file alone: no link
                    f.truncate(nbytes)
            return
    if nbytes == 0 and not final:
        open_for_writing(want).close()
        return
    raise ValueError(
        f"{final_path} is missing or shorter than its progress file says; delete the output "
        "directory and run again"
    )
