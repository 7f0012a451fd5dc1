"""WindowIterator: determinism, resume equivalence, host sharding, layouts, errors."""

import json

import numpy as np
import pytest

from gpn_jax.data.windows import WindowIterator

T, B = 8, 4
TOKENS = np.arange(23 * T + 5, dtype=np.uint32)  # 23 windows, 5 steps/epoch, 5 spare tokens


def take(it, n):
    return [next(it) for _ in range(n)]


def window_starts(batch):
    return [int(row[0]) for row in batch]


@pytest.mark.parametrize("layout", ["shuffled", "sequential", "streams"])
def test_batches_are_windows_int32_and_deterministic(layout):
    a = take(WindowIterator(TOKENS, B, T, seed=3, layout=layout), 12)
    b = take(WindowIterator(TOKENS, B, T, seed=3, layout=layout), 12)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == np.int32 and x.shape == (B, T)
        np.testing.assert_array_equal(x, y)
        assert all(s % T == 0 for s in window_starts(x))  # aligned, non-overlapping windows
        np.testing.assert_array_equal(x - x[:, :1], np.broadcast_to(np.arange(T), x.shape))


def test_shuffled_epoch_is_a_permutation_and_reshuffles():
    it = WindowIterator(TOKENS, B, T, seed=0)
    epochs = [sum((window_starts(b) for b in take(it, it.steps_per_epoch)), []) for _ in range(2)]
    for starts in epochs:
        assert len(set(starts)) == len(starts) == 20
    assert epochs[0] != epochs[1]
    other = WindowIterator(TOKENS, B, T, seed=1)
    assert sum((window_starts(b) for b in take(other, 5)), []) != epochs[0]


def test_sequential_and_streams_orders():
    seq = WindowIterator(TOKENS, B, T, layout="sequential")
    assert window_starts(next(seq)) == [0, 8, 16, 24]
    streams = WindowIterator(TOKENS, B, T, layout="streams")
    assert [window_starts(b) for b in take(streams, 2)] == [[0, 40, 80, 120], [8, 48, 88, 128]]


def test_finite_iterator_stops_after_one_epoch():
    it = WindowIterator(TOKENS, B, T, layout="sequential", repeat=False)
    assert len(list(it)) == 5


@pytest.mark.parametrize("layout", ["shuffled", "streams"])
def test_resume_from_state_matches_uninterrupted(layout):
    full = take(WindowIterator(TOKENS, B, T, seed=7, layout=layout), 13)
    first = WindowIterator(TOKENS, B, T, seed=7, layout=layout)
    take(first, 6)
    state = json.loads(json.dumps(first.get_state()))
    assert state["next_index"] == 6 and state["seed"] == 7  # Grain's position: the step
    resumed = WindowIterator(TOKENS, B, T, seed=0, layout=layout)  # the state carries the seed
    resumed.set_state(state)
    for x, y in zip(take(resumed, 7), full[6:], strict=True):
        np.testing.assert_array_equal(x, y)
    by_step = WindowIterator(TOKENS, B, T, seed=7, layout=layout, start_step=6)
    np.testing.assert_array_equal(next(by_step), full[6])


def test_set_state_rejects_other_geometry():
    state = WindowIterator(TOKENS, B, T).get_state()
    with pytest.raises(ValueError, match="seq_len 8 != 4"):
        WindowIterator(TOKENS, B, 4).set_state(state)


@pytest.mark.parametrize("count", [2, 4])
@pytest.mark.parametrize("layout", ["shuffled", "streams"])
def test_host_shards_union_is_the_global_batch(count, layout):
    whole = take(WindowIterator(TOKENS, B, T, seed=5, layout=layout), 7)
    hosts = [
        take(
            WindowIterator(
                TOKENS, B, T, seed=5, layout=layout, process_index=p, process_count=count
            ),
            7,
        )
        for p in range(count)
    ]
    for step, batch in enumerate(whole):
        assert all(h[step].shape == (B // count, T) for h in hosts)
        np.testing.assert_array_equal(np.concatenate([h[step] for h in hosts]), batch)


def test_too_small_and_bad_args():
    with pytest.raises(ValueError, match=r"30 tokens available, one \(4, 8\) batch needs 32"):
        WindowIterator(TOKENS[:30], B, T)
    with pytest.raises(ValueError, match="divisible"):
        WindowIterator(TOKENS, B, T, process_count=3)
    with pytest.raises(ValueError, match="layout"):
        WindowIterator(TOKENS, B, T, layout="random")
