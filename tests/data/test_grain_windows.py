"""The Grain window pipeline: the reference window order per layout, on np arrays and
memory-mapped bin: shards; per-host sharding; the position through an orbax checkpoint."""

import json
import shutil

import grain
import numpy as np
import pytest

from gpn_jax.checkpoints import checksums
from gpn_jax.checkpoints.manager import Checkpointer
from gpn_jax.data.bin_source import open_bin
from gpn_jax.data.windows import WindowIterator, WindowSource

T, B = 8, 4
NUM_WINDOWS = 23  # 5 steps/epoch, 3 windows and 5 tokens unused
TOKENS = np.arange(NUM_WINDOWS * T + 5, dtype=np.uint32)  # window w holds w*T .. w*T + T-1


def reference_ids(layout: str, step: int, seed: int) -> list[int]:
    """The window order, written out independently of gpn_jax (the pre-Grain iterator's)."""
    per_epoch = NUM_WINDOWS // B
    epoch, index = divmod(step, per_epoch)
    if layout == "streams":
        return [row * per_epoch + index for row in range(B)]
    slots = list(range(index * B, (index + 1) * B))
    if layout == "sequential":
        return slots
    perm = np.random.default_rng([seed, epoch]).permutation(NUM_WINDOWS)
    return [int(perm[s]) for s in slots]


def window_ids(batch) -> list[int]:
    assert batch.dtype == np.int32 and batch.shape[1] == T
    np.testing.assert_array_equal(batch - batch[:, :1], np.broadcast_to(np.arange(T), batch.shape))
    return [int(row[0]) // T for row in batch]


@pytest.fixture
def bin_tokens(tmp_path):
    """TOKENS as two memory-mapped shards, cut inside window 9 (a window spans both)."""
    folder = tmp_path / "shards"
    folder.mkdir()
    TOKENS[:77].tofile(folder / "data_0000.bin")
    TOKENS[77:].tofile(folder / "data_0001.bin")
    return open_bin(str(folder), "uint32")


@pytest.mark.parametrize("layout", ["shuffled", "sequential", "streams"])
@pytest.mark.parametrize("kind", ["array", "bin"])
def test_grain_batches_follow_the_reference_order(layout, kind, bin_tokens):
    tokens = TOKENS if kind == "array" else bin_tokens
    it = WindowIterator(tokens, B, T, seed=3, layout=layout)
    for step in range(12):  # two epochs and a bit: shuffled reshuffles per epoch
        batch = next(it)
        assert window_ids(batch) == reference_ids(layout, step, seed=3), step
        np.testing.assert_array_equal(batch, it.batch_at(step))
    assert it.get_state()["next_index"] == 12


def test_heldout_iteration_is_one_epoch_in_order(bin_tokens):
    it = WindowIterator(bin_tokens, B, T, layout="sequential", repeat=False, name="held-out")
    assert [window_ids(b) for b in it] == [reference_ids("sequential", k, 0) for k in range(5)]


def test_window_source_is_a_grain_random_access_source(bin_tokens):
    source = WindowSource(bin_tokens, T)
    assert len(source) == NUM_WINDOWS and window_ids(source[9][None]) == [9]
    ds = grain.MapDataset.source(source).batch(3)  # grain's own batching reads it too
    assert window_ids(ds[2]) == [6, 7, 8]


class ReadLog:
    """A token array that records which windows were read from it."""

    def __init__(self, tokens):
        self.tokens, self.read = tokens, set()

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, key: slice):
        self.read.add(key.start // T)
        return self.tokens[key]


@pytest.mark.parametrize("layout", ["shuffled", "sequential", "streams"])
def test_two_hosts_partition_each_global_batch_and_read_only_their_rows(layout):
    whole = WindowIterator(TOKENS, B, T, seed=5, layout=layout)
    logs = [ReadLog(TOKENS) for _ in range(2)]
    hosts = [
        WindowIterator(logs[p], B, T, seed=5, layout=layout, process_index=p, process_count=2,
                       read_options=grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
        for p in range(2)
    ]  # fmt: skip
    mine = [set(), set()]
    for _ in range(7):
        want = next(whole)
        rows = [next(h) for h in hosts]
        assert all(r.shape == (B // 2, T) for r in rows)
        np.testing.assert_array_equal(np.concatenate(rows), want)
        for p in range(2):
            mine[p].update(window_ids(rows[p]))
    assert logs[0].read == mine[0] and logs[1].read == mine[1]
    assert not mine[0] & mine[1] or layout == "shuffled"  # reshuffled epochs may repeat


@pytest.mark.parametrize("layout", ["shuffled", "streams"])
def test_position_round_trips_through_an_orbax_checkpoint(tmp_path, layout):
    uninterrupted = WindowIterator(TOKENS, B, T, seed=7, layout=layout)
    want = [next(uninterrupted) for _ in range(13)]
    first = WindowIterator(TOKENS, B, T, seed=7, layout=layout)
    for _ in range(7):  # mid-epoch 1
        next(first)
    state = {"step": np.zeros((), np.int32)}
    with Checkpointer(tmp_path / "run", async_save=False) as ckpt:
        ckpt.save(7, state, first.get_state(), {"model": {}}, {"step": 7})
        next(first)  # moves on after the save: the checkpoint keeps step 7
    saved = json.loads((tmp_path / "run/checkpoints/7/data/process_0-of-1.json").read_text())
    assert saved["next_index"] == 7 and saved["seed"] == 7  # written by grain's handler
    with Checkpointer(tmp_path / "run") as ckpt:
        step, _, data_state, _, _ = ckpt.restore(state)
    resumed = WindowIterator(TOKENS, B, T, seed=0, layout=layout)  # the state brings the seed
    resumed.set_state(data_state)
    for k in range(7, 13):
        np.testing.assert_array_equal(next(resumed), want[k])


def test_a_checkpoint_from_before_checksums_still_resumes(tmp_path):
    """A step whose orbax metadata lists no checksums item is restored (unverified)."""
    state = {"step": np.zeros((), np.int32)}
    it = WindowIterator(TOKENS, B, T, seed=2)
    for _ in range(6):
        next(it)
    with Checkpointer(tmp_path / "run", async_save=False) as ckpt:
        ckpt.save(6, state, it.get_state(), {"model": {}}, {"step": 6})
    shutil.rmtree(tmp_path / "run/checkpoints/6/checksums")
    meta_path = tmp_path / "run/checkpoints/6/_CHECKPOINT_METADATA"
    meta = json.loads(meta_path.read_text())
    del meta["item_handlers"]["checksums"]
    meta_path.write_text(json.dumps(meta))
    with Checkpointer(tmp_path / "run") as ckpt:
        _, _, data_state, _, _ = ckpt.restore(state)
    resumed = WindowIterator(TOKENS, B, T)
    resumed.set_state(data_state)
    for step in (6, 7):
        assert window_ids(next(resumed)) == reference_ids("shuffled", step, seed=2)


def test_a_checkpoint_of_another_host_count_resumes_from_host_0s_position(tmp_path):
    """Every host saves the same global step; resuming on one host reads host 0's file."""
    first = WindowIterator(TOKENS, B, T, seed=1, process_index=0, process_count=2)
    next(first), next(first)
    state = {"step": np.zeros((), np.int32)}
    with Checkpointer(tmp_path / "run", async_save=False) as ckpt:
        ckpt.save(2, state, first.get_state(), {"model": {}}, {"step": 2})
    data = tmp_path / "run/checkpoints/2/data"
    (data / "process_0-of-1.json").rename(data / "process_0-of-2.json")  # as 2 hosts wrote it
    step_dir = tmp_path / "run/checkpoints/2"  # whose record host 0 seals after both wrote
    record = json.dumps(checksums.file_record(step_dir), sort_keys=True)
    (step_dir / "checksums" / checksums.FILES).write_text(record)
    with Checkpointer(tmp_path / "run") as ckpt:
        _, _, data_state, _, _ = ckpt.restore(state)
    one_host = WindowIterator(TOKENS, B, T)
    one_host.set_state(data_state)
    assert window_ids(next(one_host)) == reference_ids("shuffled", 2, seed=1)


def test_at_epoch_start_is_true_exactly_at_every_epochs_first_batch():
    it = WindowIterator(np.arange(8 * 3 + 1), 4, 3, layout="streams")  # 8 windows: 2 steps
    starts = []
    for _ in range(5):
        starts.append(it.at_epoch_start)
        next(it)
    assert it.steps_per_epoch == 2 and starts == [True, False, True, False, True]
