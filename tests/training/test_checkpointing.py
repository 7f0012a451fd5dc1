"""Tests for gpn_jax.checkpoints.manager (real orbax on a tmp dir)."""

import functools
import glob
import logging
import os
import resource
import shutil
import signal

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from gpn_jax.checkpoints.manager import Checkpointer, CheckpointError

LOGGER = "gpn_jax.checkpoints.manager"

# After a failed read, tensorstore's C++ threads may still call back into the
# (already closed) asyncio loop orbax used; harmless, but pytest reports it.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@functools.cache
def make_state(seed: float = 0.0):
    """Train-state-like pytree: f32/bf16/int32 arrays, adamw opt_state, step, rng (one per
    seed, shared: tests never modify it)."""
    params = {
        "w": jnp.arange(24, dtype=jnp.float32).reshape(4, 6) + seed,
        "emb": (jnp.linspace(-1, 1, 12, dtype=jnp.float32) * (seed + 1)).astype(jnp.bfloat16),
        "ids": jnp.arange(5, dtype=jnp.int32) * int(seed + 1),
    }
    trainable = {k: v for k, v in params.items() if k != "ids"}
    opt = optax.adamw(1e-3)
    opt_state = opt.init(trainable)
    # One real update so mu/nu/count are non-trivial.
    grads = jax.tree.map(lambda x: jnp.ones_like(x) * 0.5, trainable)
    _, opt_state = opt.update(grads, opt_state, trainable)
    return {
        "params": params,
        "opt_state": opt_state,
        "step": jnp.asarray(int(seed) * 10, jnp.int32),
        "rng": jax.random.PRNGKey(int(seed)),
    }


def abstract(tree, sharding=None):
    """ShapeDtypeStruct pytree; keeps each leaf's sharding unless one is given."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding or x.sharding), tree
    )


def assert_tree_exact(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def two_saved(tmp_path_factory) -> str:
    """A workdir with steps 1 and 2 saved (distinct state/data); tests damage copies of it."""
    workdir = str(tmp_path_factory.mktemp("two_saved"))
    with Checkpointer(workdir, keep=5) as ck:
        ck.save(1, make_state(1.0), {"shard": 0, "pos": 11}, {"lr": 1e-3}, {"tokens_seen": 100})
        ck.save(2, make_state(2.0), {"shard": 0, "pos": 22}, {"lr": 1e-3}, {"tokens_seen": 200})
        ck.wait_until_finished()
    return workdir


def save_two(two_saved, workdir):
    """Steps 1 and 2 in `workdir` (a copy of `two_saved`); returns their states and step 2's
    directory."""
    shutil.copytree(two_saved, workdir, dirs_exist_ok=True)
    return make_state(1.0), make_state(2.0), os.path.join(str(workdir), "checkpoints", "2")


@pytest.mark.parametrize("async_save", [True, False])
def test_roundtrip_exact(tmp_path, async_save):
    state = make_state(3.0)
    ck = Checkpointer(tmp_path, keep=3, async_save=async_save)
    assert ck.directory == os.path.join(str(tmp_path), "checkpoints")
    assert ck.save(7, state, {"pos": 5}, {"model": {"d": 8}, "name": "x"}, {"tokens_seen": 42})
    ck.wait_until_finished()
    assert ck.latest_step() == 7 and ck.all_steps() == [7]
    step, got, data, cfg, meta = ck.restore(abstract(state))
    ck.close()
    assert step == 7
    assert_tree_exact(got, state)
    assert isinstance(got["opt_state"][0], optax.ScaleByAdamState)
    assert data == {"pos": 5}
    assert cfg == {"model": {"d": 8}, "name": "x"}
    assert meta == {"tokens_seen": 42}


def test_restore_from_fresh_process_onto_other_mesh(tmp_path):
    """Save sharded over 8 devices, reopen, restore replicated onto a 4-device mesh."""
    devs = jax.devices()
    if len(devs) < 8:
        pytest.skip("needs 8 (forced host) devices")
    src = NamedSharding(Mesh(np.array(devs), ("d",)), P("d"))
    state = {"w": jax.device_put(jnp.arange(64, dtype=jnp.float32).reshape(8, 8), src)}
    with Checkpointer(tmp_path) as ck:
        ck.save(1, state, {}, {}, {})
    dst = NamedSharding(Mesh(np.array(devs[:4]).reshape(2, 2), ("a", "b")), P(None, "b"))
    with Checkpointer(tmp_path) as ck:  # new manager: discovers steps from disk
        _, got, *_ = ck.restore(abstract(state, dst))
    assert got["w"].sharding == dst
    assert_tree_exact(got, state)


def test_restore_with_concrete_example_target(tmp_path):
    state = make_state(1.0)
    with Checkpointer(tmp_path) as ck:
        ck.save(1, state, {}, {}, {})
        _, got, *_ = ck.restore(make_state(0.0))
    assert_tree_exact(got, state)


def test_restore_empty_dir_raises(tmp_path):
    with Checkpointer(tmp_path) as ck:
        assert ck.latest_step() is None
        with pytest.raises(CheckpointError, match="no checkpoint"):
            ck.restore(make_state())
        with pytest.raises(CheckpointError, match="no readable checkpoint in"):
            ck.restore_latest_good(make_state())


def _truncate_array_files(step_dir):
    files = glob.glob(os.path.join(step_dir, "state", "**", "d", "*"), recursive=True)
    assert files, "expected OCDBT data files under state/**/d/"
    for f in files:
        with open(f, "r+b") as fh:
            fh.truncate(7)


def _delete_array_files(step_dir):
    for f in glob.glob(os.path.join(step_dir, "state", "**", "d", "*"), recursive=True):
        os.remove(f)


def _garble_manifests(step_dir):
    files = glob.glob(os.path.join(step_dir, "state", "**", "manifest.ocdbt"), recursive=True)
    assert files
    for f in files:
        with open(f, "r+b") as fh:
            fh.seek(4)
            fh.write(b"\xde\xad\xbe\xef" * 4)


def _delete_data_item(step_dir):
    shutil.rmtree(os.path.join(step_dir, "data"))


def _delete_commit_marker(step_dir):
    os.remove(os.path.join(step_dir, "commit_success.txt"))


def _delete_array_metadata(step_dir):
    os.remove(os.path.join(step_dir, "state", "_METADATA"))


def _garble_config_json(step_dir):
    with open(os.path.join(step_dir, "config", "metadata"), "w") as f:
        f.write('{"lr": 0.0')


@pytest.mark.parametrize(
    "corrupt",
    [
        _truncate_array_files,
        _delete_array_files,
        _garble_manifests,
        _delete_data_item,
        _delete_commit_marker,
        _delete_array_metadata,
        _garble_config_json,
    ],
)
def test_restore_latest_good_falls_back(tmp_path, two_saved, caplog, corrupt):
    s1, _, step2_dir = save_two(two_saved, tmp_path)
    corrupt(step2_dir)
    with Checkpointer(tmp_path, keep=5) as ck, caplog.at_level(logging.WARNING, logger=LOGGER):
        assert ck.latest_step() == 2  # still finalized on disk; damage shows on read
        step, got, data, cfg, meta = ck.restore_latest_good(abstract(s1))
    assert step == 1
    assert_tree_exact(got, s1)
    assert data == {"shard": 0, "pos": 11} and meta == {"tokens_seen": 100}
    assert cfg == {"lr": 1e-3}
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert warnings[0].startswith("checkpoint step 2 unreadable")


def test_restore_latest_good_none_readable(tmp_path, two_saved, caplog):
    s1, _, step2_dir = save_two(two_saved, tmp_path)
    _delete_data_item(step2_dir)
    _truncate_array_files(os.path.join(os.path.dirname(step2_dir), "1"))
    with Checkpointer(tmp_path) as ck, caplog.at_level(logging.WARNING, logger=LOGGER):
        with pytest.raises(CheckpointError, match="no readable checkpoint in .*step 2: .*step 1: "):
            ck.restore_latest_good(abstract(s1))
    assert sum(r.name == LOGGER for r in caplog.records) == 2


def test_quarantine_lets_trainer_resave(tmp_path, two_saved, caplog):
    s1, s2, step2_dir = save_two(two_saved, tmp_path)
    _truncate_array_files(step2_dir)
    with Checkpointer(tmp_path) as ck, caplog.at_level(logging.WARNING, logger=LOGGER):
        # Without quarantine the bad step stays and blocks re-saving it (loudly).
        assert ck.restore_latest_good(abstract(s1))[0] == 1
        assert not ck.save(2, s2, {}, {}, {})
        assert any("step 2 not saved" in r.getMessage() for r in caplog.records)
        assert ck.restore_latest_good(abstract(s1), quarantine=True)[0] == 1
        assert ck.all_steps() == [1]
        assert os.path.isdir(step2_dir + ".unreadable-0")
        assert ck.save(2, s2, {"pos": 2}, {}, {})
        step, got, data, *_ = ck.restore_latest_good(abstract(s1))
    assert step == 2 and data == {"pos": 2}
    assert_tree_exact(got, s2)


def test_tmp_dir_of_killed_save_is_ignored(tmp_path, two_saved, caplog):
    _, _, step2_dir = save_two(two_saved, tmp_path)
    ckpt_dir = os.path.dirname(step2_dir)
    # A killed save leaves `<step>.orbax-checkpoint-tmp` (never renamed to `<step>`);
    # older orbax versions appended `-<timestamp>`. Fill them so they look complete.
    leftover = os.path.join(ckpt_dir, "3.orbax-checkpoint-tmp")
    old_style = os.path.join(ckpt_dir, "4.orbax-checkpoint-tmp-1700000000")
    for d in (leftover, old_style):
        shutil.copytree(step2_dir, d)
    # Reader mode: left in place, but still not a step.
    with Checkpointer(tmp_path, cleanup_tmp=False) as ck:
        assert ck.latest_step() == 2 and ck.all_steps() == [1, 2]
        assert ck.restore_latest_good(make_state())[0] == 2
    assert os.path.isdir(leftover) and os.path.isdir(old_style)
    # Default: removed at construction, with a warning.
    with caplog.at_level(logging.WARNING, logger=LOGGER), Checkpointer(tmp_path) as ck:
        assert ck.latest_step() == 2
        # Appearing while open (e.g. another writer's in-flight save): ignored too.
        shutil.copytree(step2_dir, leftover)
        ck.reload()
        assert ck.all_steps() == [1, 2]
    assert not os.path.exists(old_style)
    assert sum("removing unfinished checkpoint" in r.getMessage() for r in caplog.records) == 2


def test_keep_last_n_plus_best(tmp_path):
    losses = {1: 0.5, 2: 0.1, 3: 0.4, 4: 0.3, 5: 0.6}
    state = {"x": jnp.zeros((2,), jnp.float32)}
    ck = Checkpointer(tmp_path, keep=2, keep_best=1, best_metric="heldout_loss")
    for step, loss in losses.items():
        ck.save(step, state, {}, {}, {}, metrics={"heldout_loss": np.float32(loss)})
    ck.wait_until_finished()
    assert ck.all_steps() == [2, 4, 5]  # last 2 + best (lowest loss)
    ck.close()
    on_disk = sorted(int(n) for n in os.listdir(ck.directory) if n.isdigit())
    assert on_disk == [2, 4, 5]
    # Metrics persist: a fresh manager still knows step 2 is best.
    with Checkpointer(tmp_path, keep=2, keep_best=1) as ck:
        ck.save(6, state, {}, {}, {}, metrics={"heldout_loss": 0.7})
        ck.save(7, state, {}, {}, {})  # no metric: kept only as one of the last 2
        ck.wait_until_finished()
        assert ck.all_steps() == [2, 6, 7]


def test_unranked_periodic_save_is_quiet(tmp_path, caplog):
    """A save between evaluations (no metric) is normal with keep_best: no orbax warning."""
    state = {"x": jnp.zeros((2,), jnp.float32)}
    with caplog.at_level(logging.WARNING), Checkpointer(tmp_path, keep=2, keep_best=1) as ck:
        ck.save(1, state, {}, {}, {})
        ck.save(2, state, {}, {}, {}, metrics={"heldout_loss": 0.5})
        ck.wait_until_finished()
        assert ck.all_steps() == [1, 2]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_keep_best_max_mode(tmp_path):
    state = {"x": jnp.zeros((2,), jnp.float32)}
    with Checkpointer(tmp_path, keep=1, keep_best=2, best_metric="acc", best_mode="max") as ck:
        for step, acc in enumerate([0.9, 0.2, 0.8, 0.1, 0.3], start=1):
            ck.save(step, state, {}, {}, {}, metrics={"acc": acc})
        ck.wait_until_finished()
        assert ck.all_steps() == [1, 3, 5]


def test_parent_is_file_raises(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CheckpointError, match="not usable") as ei:
        Checkpointer(blocker / "run")
    assert "\n" not in str(ei.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_parent_raises(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(CheckpointError, match="not usable"):
            Checkpointer(ro / "run")
    finally:
        ro.chmod(0o700)


def test_bad_best_mode():
    with pytest.raises(ValueError, match="best_mode"):
        Checkpointer("/tmp/unused", best_mode="lowest")


def _dir_listing(root):
    return sorted(
        (os.path.relpath(os.path.join(d, f), root), os.path.getsize(os.path.join(d, f)))
        for d, _, files in os.walk(root)
        for f in files
    )


@pytest.mark.parametrize(
    "error",
    [
        PermissionError(13, "Permission denied"),
        OSError(5, "Input/output error"),
        ValueError('PERMISSION_DENIED: Error reading local file "x"'),
        ValueError("UNAVAILABLE: transient"),
        RuntimeError("unexpected"),
    ],
    ids=lambda e: type(e).__name__ + ":" + str(e).split(":")[0][:20],
)
def test_read_error_that_is_not_damage_stops_and_moves_nothing(
    tmp_path, two_saved, monkeypatch, error
):
    s1, _, step2_dir = save_two(two_saved, tmp_path)
    _truncate_array_files(os.path.join(os.path.dirname(step2_dir), "1"))  # damage too
    before = _dir_listing(tmp_path)
    with Checkpointer(tmp_path, keep=5) as ck:
        mngr = ck._mngr

        def failing_restore(step, *args, **kwargs):
            if step == 2:
                raise error
            return type(mngr).restore(mngr, step, *args, **kwargs)

        monkeypatch.setattr(mngr, "restore", failing_restore)
        with pytest.raises(CheckpointError) as err:
            ck.restore_latest_good(abstract(s1), quarantine=True)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(
        f"cannot read checkpoint step 2 in {ck.directory}: {type(error).__name__}"
    )
    assert "not a sign of damage" in msg
    assert _dir_listing(tmp_path) == before


def test_damaged_steps_are_moved_aside_with_a_log_line_each(tmp_path, two_saved, caplog):
    s1, s2, step2_dir = save_two(two_saved, tmp_path)
    with Checkpointer(tmp_path, keep=5) as ck:
        ck.save(3, s2, {}, {}, {})
    step3_dir = os.path.join(os.path.dirname(step2_dir), "3")
    _truncate_array_files(step2_dir)
    _delete_commit_marker(step3_dir)
    with Checkpointer(tmp_path, keep=5) as ck, caplog.at_level(logging.WARNING, logger=LOGGER):
        assert ck.restore_latest_good(abstract(s1), quarantine=True)[0] == 1
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert messages[0].startswith("checkpoint step 3 unreadable, falling back: incomplete")
    assert messages[1].startswith("checkpoint step 2 unreadable, falling back: ValueError")
    for d in (step2_dir, step3_dir):
        assert f"moved unreadable checkpoint {d} to {d}.unreadable-0" in messages
        assert os.path.isdir(d + ".unreadable-0") and not os.path.exists(d)


@pytest.fixture
def small_file_size_limit():
    """Writes past 64 KiB fail with EFBIG (SIGXFSZ ignored), as on a full or quota'd disk."""
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    yield lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, old_limit[1]))
    resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
    signal.signal(signal.SIGXFSZ, old_handler)


@pytest.mark.parametrize("async_save", [True, False])
def test_failed_write_is_one_line_and_leaves_no_step(
    tmp_path, two_saved, capfd, small_file_size_limit, async_save
):
    s1, _, step2_dir = save_two(two_saved, tmp_path)
    # 1 MiB of incompressible floats (orbax compresses): over the limit.
    big = {"w": jnp.asarray(np.random.RandomState(0).standard_normal((256, 1024)), jnp.float32)}
    ck = Checkpointer(tmp_path, keep=5, async_save=async_save)
    capfd.readouterr()
    small_file_size_limit()
    with pytest.raises(CheckpointError) as err:
        ck.save(3, big, {}, {}, {})
        ck.wait_until_finished()  # async: the error surfaces here (or at the next save)
    ck.wait_until_finished()  # reported once; closing after it is quiet
    ck.close()
    directory = os.path.dirname(step2_dir)
    assert str(err.value) == (
        f"cannot write checkpoint step 3 to {directory}/3: File too large (EFBIG); "
        "its unfinished files were removed; newest complete checkpoint: step 2"
    )
    out, errout = capfd.readouterr()
    assert "Traceback" not in errout and "Traceback" not in out, errout[-2000:]
    assert sorted(os.listdir(directory)) == ["1", "2"]
    with Checkpointer(tmp_path, cleanup_tmp=False) as ck:
        assert ck.all_steps() == [1, 2]
        assert_tree_exact(ck.restore(abstract(s1), 1)[1], s1)


def _abandoned(name: str):
    """A coroutine with `name`'s qualified name, created and dropped unawaited."""

    def async_serialize_from_host():
        async def write_fragment():
            pass

        async def other_work():
            pass

        return {"write_fragment": write_fragment, "other_work": other_work}[name]()

    coro = async_serialize_from_host()
    del coro  # CPython warns here, when the never-awaited coroutine is freed


def test_after_a_failed_save_abandoned_fragment_writes_are_silent():
    """Only orbax's dropped `write_fragment` coroutines are silenced, so the run's one-line
    error stays one line; any other never-awaited coroutine still warns."""
    import warnings

    from gpn_jax.checkpoints.failures import silence_abandoned_writes

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _abandoned("write_fragment")
        assert any("write_fragment' was never awaited" in str(w.message) for w in caught)
        caught.clear()
        silence_abandoned_writes()
        _abandoned("write_fragment")
        _abandoned("other_work")
    messages = [str(w.message) for w in caught]
    other = "_abandoned.<locals>.async_serialize_from_host.<locals>.other_work"
    assert messages == [f"coroutine '{other}' was never awaited"], messages


def _asyncio_record(exc: BaseException) -> logging.LogRecord:
    """What asyncio logs when a failed future is collected without its result being read."""
    return logging.LogRecord(
        "asyncio",
        logging.ERROR,
        "/usr/lib/python3/asyncio/base_events.py",
        1771,
        "Future exception was never retrieved\nfuture: <Future finished exception=%r>",
        (exc,),
        (type(exc), exc, exc.__traceback__),
    )


def test_a_failed_orbax_writes_unretrieved_future_is_not_logged_again():
    """The one-line CheckpointError already reports a failed save; asyncio's late log of one of
    its write futures (its path and message name no orbax; its traceback does, through a chained
    exception) is dropped, and the same log for an error raised elsewhere is kept."""
    ns = {}
    exec(
        compile("def write():\n    raise OSError(27, 'File too large')\n", "/x/orbax/w.py", "exec"),
        ns,
    )

    def worker(fn):
        try:
            fn()
        except OSError as e:
            raise RuntimeError("write failed") from e

    def raised(fn):
        try:
            worker(fn)
        except RuntimeError as e:
            return e

    def elsewhere():
        raise OSError(27, "File too large")

    from gpn_jax.checkpoints.failures import FAILURE_FILTER as f

    assert not f.filter(_asyncio_record(raised(ns["write"])))
    assert f.filter(_asyncio_record(raised(elsewhere)))
