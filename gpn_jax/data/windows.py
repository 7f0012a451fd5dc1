"""A deterministic, resumable iterator of (B, T) int32 token windows.

The token array is cut into consecutive non-overlapping windows of `seq_len` tokens
(the tail that does not fill a window is unused). A global batch of `batch_size` windows
is chosen per step according to `layout`:

* 'shuffled':   a fresh permutation of all windows each epoch (seeded by `seed`, epoch);
* 'sequential': windows in order, batch k = windows kB .. kB+B-1;
* 'streams':    row r reads its own contiguous stretch of the array, batch k holding window
                k of every stretch (so a carried recurrent state follows the text).

An epoch is `num_windows // batch_size` steps. Each host yields only its rows
[p*B/P, (p+1)*B/P) of every global batch. The position is `get_state()`, a small
JSON-serialisable dict.
"""

import numpy as np

LAYOUTS = ("shuffled", "sequential", "streams")
_GEOMETRY = ("layout", "num_windows", "batch_size", "seq_len")


class WindowIterator:
    """Yields np.int32 (batch_size / process_count, seq_len) batches; see the module doc."""

    def __init__(
        self,
        tokens,
        batch_size: int,
        seq_len: int,
        *,
        seed: int = 0,
        layout: str = "shuffled",
        repeat: bool = True,
        process_index: int = 0,
        process_count: int = 1,
        start_step: int = 0,
        name: str = "train",
    ):
        _check_args(batch_size, seq_len, layout, process_index, process_count)
        self.tokens, self.batch_size, self.seq_len = tokens, batch_size, seq_len
        self.seed, self.layout, self.repeat = seed, layout, repeat
        self.process_index, self.process_count = process_index, process_count
        self.num_windows = len(tokens) // seq_len
        _check_size(name, len(tokens), batch_size, seq_len)
        self.steps_per_epoch = self.num_windows // batch_size
        self.step = start_step
        self._perm = (None, None)

    def __iter__(self) -> "WindowIterator":
        return self

    def __next__(self) -> np.ndarray:
        if not self.repeat and self.step >= self.steps_per_epoch:
            raise StopIteration
        batch = self.batch_at(self.step)
        self.step += 1
        return batch

    def get_state(self) -> dict:
        """The position of the next batch: epoch, index within it, seed, and the geometry."""
        epoch, index = divmod(self.step, self.steps_per_epoch)
        return {"epoch": epoch, "index": index, "seed": self.seed, **self._geometry()}

    def set_state(self, state: dict) -> None:
        """Moves to a position from `get_state()` (adopting its seed)."""
        mine = self._geometry()
        bad = [f"{k} {state.get(k)!r} != {mine[k]!r}" for k in _GEOMETRY if state.get(k) != mine[k]]
        if bad:
            raise ValueError(f"saved data state does not fit this data: {', '.join(bad)}")
        self.seed = int(state["seed"])
        self.step = int(state["epoch"]) * self.steps_per_epoch + int(state["index"])

    def _geometry(self) -> dict:
        return {
            "layout": self.layout,
            "num_windows": self.num_windows,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
        }

    def window_ids(self, step: int) -> np.ndarray:
        """Global window indices (batch_size,) of batch `step`."""
        epoch, index = divmod(step, self.steps_per_epoch)
        rows = np.arange(self.batch_size, dtype=np.int64)
        if self.layout == "streams":
            return rows * self.steps_per_epoch + index
        slots = index * self.batch_size + rows
        return self._permutation(epoch)[slots] if self.layout == "shuffled" else slots

    def _permutation(self, epoch: int) -> np.ndarray:
        if self._perm[0] != (self.seed, epoch):
            rng = np.random.default_rng([self.seed, epoch])
            self._perm = ((self.seed, epoch), rng.permutation(self.num_windows))
        return self._perm[1]

    def host_rows(self) -> slice:
        """This host's rows of a global batch."""
        per_host = self.batch_size // self.process_count
        return slice(self.process_index * per_host, (self.process_index + 1) * per_host)

    def batch_at(self, step: int) -> np.ndarray:
        """This host's rows of batch `step` (does not move the iterator)."""
        starts = self.window_ids(step)[self.host_rows()] * self.seq_len
        return gather_windows(self.tokens, starts, self.seq_len)


def gather_windows(tokens, starts: np.ndarray, seq_len: int) -> np.ndarray:
    """Stacks tokens[s : s + seq_len] for every start, as int32."""
    if isinstance(tokens, np.ndarray):
        return tokens[starts[:, None] + np.arange(seq_len)].astype(np.int32)
    return np.stack([np.asarray(tokens[s : s + seq_len]) for s in starts]).astype(np.int32)


def _check_args(batch_size, seq_len, layout, process_index, process_count) -> None:
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size and seq_len must be positive, got {batch_size}, {seq_len}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if not 0 <= process_index < process_count or batch_size % process_count:
        raise ValueError(
            f"process {process_index} of {process_count}: need 0 <= index < count and "
            f"batch_size {batch_size} divisible by the process count"
        )


def _check_size(name: str, num_tokens: int, batch_size: int, seq_len: int) -> None:
    needed = batch_size * seq_len
    if num_tokens < needed:
        raise ValueError(
            f"{name} corpus too small: {num_tokens} tokens available, one ({batch_size}, "
            f"{seq_len}) batch needs {needed}; use more data or a smaller batch_size/seq_len"
        )
