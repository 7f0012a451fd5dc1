"""A deterministic, resumable Grain pipeline of (B, T) int32 token windows.

The token array is cut into consecutive non-overlapping windows of `seq_len` tokens
(the tail that does not fill a window is unused). A global batch of `batch_size` windows
is chosen per step according to `layout`:

* 'shuffled':   a fresh permutation of all windows each epoch (seeded by `seed`, epoch);
* 'sequential': windows in order, batch k = windows kB .. kB+B-1;
* 'streams':    row r reads its own contiguous stretch of the array, batch k holding window
                k of every stretch (so a carried recurrent state follows the text).

An epoch is `num_windows // batch_size` steps. Each host yields only its rows
[p*B/P, (p+1)*B/P) of every global batch, and reads only those windows.

The pipeline is Grain's: `WindowSource` is a random-access data source of the windows (over
a flat np array or memory-mapped `bin:` shards); a `grain.MapDataset` of step numbers
(`range(steps_per_epoch)`, repeated for training) is mapped to this host's rows of that
step's global batch, read from the source as one gather; `to_iter_dataset()` iterates it,
prefetching in a background thread. Grain's own `shuffle`/`batch`/`DataLoader` sharding are
not used on purpose: they order and shard windows differently (a contiguous range of records
per host, grain's own permutation), while every host here must read its rows of the SAME
global batch, in the order `window_ids` defines. The position is Grain's iterator state (`next_index`, the step)
plus the seed and the geometry: `get_state()`, a small JSON-serialisable dict that the
trainer saves through Grain's orbax handler (`checkpoints.manager`).

`window_ids` / `batch_at` are the plain-numpy reference of the same order (tests compare the
two; `gpn_jax.benchmarks.prepare` times the pipeline against it). That hand-written loop was
the iterator before Grain, and is no longer iterated in training.
`python -m gpn_jax.bench_prepare` compares the two rates (docs/performance.md): Grain is
somewhat slower in the raw rate, which does not matter here, since either reads batches many
times faster than a training step consumes them; Grain brings checkpointable iterator state
and per-host sharding.
"""

import grain
import numpy as np

LAYOUTS = ("shuffled", "sequential", "streams")
_GEOMETRY = ("layout", "num_windows", "batch_size", "seq_len")
# One prefetch thread, two batches ahead: the next batch is read while the device runs the
# current step; more threads only contend for the GIL (and a 128 x 2048 batch is 1 MiB).
TRAIN_READ = grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)
# Held-out passes are short and often cut off after a few batches: read in the caller.
EVAL_READ = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)


class WindowSource:
    """The windows of a flat token array as a Grain random-access data source: record i is
    tokens[i*T : (i+1)*T] as int32. `tokens` is an np.ndarray or any contiguous-sliceable
    array (e.g. memory-mapped `bin_source.ShardedTokens`); only the windows read are touched."""

    def __init__(self, tokens, seq_len: int):
        self.tokens, self.seq_len = tokens, seq_len

    def __len__(self) -> int:
        return len(self.tokens) // self.seq_len

    def __getitem__(self, index: int) -> np.ndarray:
        return self.read(np.array([index]))[0]

    def _getitems(self, indices) -> list:
        """Grain's batched read (`MapDataset.source(...)` uses it when present)."""
        return list(self.read(np.asarray(indices)))

    def read(self, ids: np.ndarray) -> np.ndarray:
        """Windows `ids` stacked (len(ids), T) int32."""
        return gather_windows(self.tokens, np.asarray(ids, np.int64) * self.seq_len, self.seq_len)

    def __repr__(self) -> str:
        return f"WindowSource({len(self)} windows of {self.seq_len} tokens)"


class WindowOrder:
    """Which windows make up global batch `step` (see the module doc); the permutation of
    the current epoch is cached (a `bin:` corpus has millions of windows)."""

    def __init__(self, layout: str, num_windows: int, batch_size: int, seed: int):
        self.layout, self.num_windows, self.batch_size = layout, num_windows, batch_size
        self.seed, self.steps_per_epoch = seed, num_windows // batch_size
        self._perm = (None, None)

    def ids(self, step: int) -> np.ndarray:
        """Global window indices (batch_size,) of batch `step`."""
        epoch, index = divmod(step, self.steps_per_epoch)
        rows = np.arange(self.batch_size, dtype=np.int64)
        if self.layout == "streams":
            return rows * self.steps_per_epoch + index
        slots = index * self.batch_size + rows
        return self._permutation(epoch)[slots] if self.layout == "shuffled" else slots

    def _permutation(self, epoch: int) -> np.ndarray:
        key, perm = self._perm  # one read: prefetch threads may replace it meanwhile
        if key != (self.seed, epoch):
            perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_windows)
            self._perm = ((self.seed, epoch), perm)
        return perm


class _HostBatch(grain.transforms.MapWithIndex):
    """Grain map: step number -> this host's rows of that step's global batch."""

    def __init__(self, source: WindowSource, order: WindowOrder, rows: slice):
        self.source, self.order, self.rows = source, order, rows

    def map_with_index(self, index: int, element):
        del element  # the step itself; the index is the same step across repeated epochs
        return self.source.read(self.order.ids(index)[self.rows])


def host_dataset(source, order, rows: slice, repeat: bool) -> grain.MapDataset:
    """The Grain `MapDataset` of this host's batches: element k is batch (step) k."""
    steps = grain.MapDataset.range(order.steps_per_epoch)
    if repeat:
        steps = steps.repeat()  # endless; the index keeps counting, so epochs reshuffle
    return steps.map_with_index(_HostBatch(source, order, rows))


class WindowIterator:
    """Yields np.int32 (batch_size / process_count, seq_len) batches from the Grain
    pipeline above; see the module doc."""

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
        read_options: grain.ReadOptions | None = None,
    ):
        _check_args(batch_size, seq_len, layout, process_index, process_count)
        self.tokens, self.batch_size, self.seq_len = tokens, batch_size, seq_len
        self.layout, self.repeat = layout, repeat
        self.process_index, self.process_count = process_index, process_count
        self.source = WindowSource(tokens, seq_len)
        self.num_windows = len(self.source)
        _check_size(name, len(tokens), batch_size, seq_len)
        self.steps_per_epoch = self.num_windows // batch_size
        self.read_options = read_options or (TRAIN_READ if repeat else EVAL_READ)
        self._start(seed, start_step)

    def _start(self, seed: int, step: int) -> None:
        """(Re)builds the Grain iterator for `seed`, positioned at `step`."""
        if hasattr(self, "_it"):
            self._it.close()  # its prefetch thread
        self.seed = seed
        self.order = WindowOrder(self.layout, self.num_windows, self.batch_size, seed)
        ds = host_dataset(self.source, self.order, self.host_rows(), self.repeat)
        self._it = iter(ds.to_iter_dataset(self.read_options))
        if step:
            self._it.set_state({"next_index": step})

    @property
    def step(self) -> int:
        """The step of the next batch (Grain's `next_index`)."""
        return int(self._it.get_state()["next_index"])

    @property
    def at_epoch_start(self) -> bool:
        """Whether the next batch is the first of an epoch (streams: every row's start)."""
        return self.step % self.steps_per_epoch == 0

    def __iter__(self) -> "WindowIterator":
        return self

    def __next__(self) -> np.ndarray:
        return next(self._it)

    def get_state(self) -> dict:
        """Grain's iterator state (`next_index`: the next step), the seed and the geometry."""
        return {**self._it.get_state(), "seed": self.seed, **self._geometry()}

    def set_state(self, state: dict) -> None:
        """Moves to a position from `get_state()` (adopting its seed)."""
        mine = self._geometry()
        bad = [f"{k} {state.get(k)!r} != {mine[k]!r}" for k in _GEOMETRY if state.get(k) != mine[k]]
        if bad:
            raise ValueError(f"saved data state does not fit this data: {', '.join(bad)}")
        step = int(state["next_index"])
        if int(state["seed"]) != self.seed:
            self._start(int(state["seed"]), step)
        else:
            self._it.set_state({"next_index": step})

    def _geometry(self) -> dict:
        return {
            "layout": self.layout,
            "num_windows": self.num_windows,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
        }

    def host_rows(self) -> slice:
        """This host's rows of a global batch."""
        per_host = self.batch_size // self.process_count
        return slice(self.process_index * per_host, (self.process_index + 1) * per_host)

    def window_ids(self, step: int) -> np.ndarray:
        """Global window indices (batch_size,) of batch `step` (the reference order)."""
        return self.order.ids(step)

    def batch_at(self, step: int) -> np.ndarray:
        """This host's rows of batch `step`, read directly in numpy, without Grain and
        without moving the iterator: the reference the pipeline is tested against."""
        return self.source.read(self.window_ids(step)[self.host_rows()])


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
