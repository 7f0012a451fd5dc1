"""Every reader of a run or a model directory verifies what it loads, as resume does, and
deletes nothing; one trainer per workdir.

The run here is saved as the trainer saves one (a `TrainState`, the data position, the
config and a meta recording the tokenizer's sha256) at steps 1 and 2, with different
parameters; each test damages a copy. `load_run` is the one loader behind evaluate,
generate, export, analyze and the lm-eval harness; `export.load` the one behind
`--model_dir`.
"""

import hashlib
import json
import logging
import os
import shutil
import threading

import jax
import numpy as np
import pytest

from experiments.configs import gpn_m_tiny
from gpn_jax.checkpoints.manager import Checkpointer, CheckpointError
from gpn_jax.checkpoints.restore import load_run
from gpn_jax.data.pipeline import DataConfig, build_data
from gpn_jax.data.text_sources import embedded_corpus
from gpn_jax.data.tokenizer import train_tokenizer
from gpn_jax.export import export, load
from gpn_jax.models import factory
from gpn_jax.training import train_step as ts
from gpn_jax.training.optimizer import make_optimizer

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _state(model, config, seed):
    return ts.init_train_state(
        model, make_optimizer(config.train, model.weight_decay_mask), jax.random.PRNGKey(seed)
    )


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(workdir, {step: params}) of a two-step run saved as training saves one."""
    c = gpn_m_tiny.get_config()
    c.train.update(dict(batch_size=8, steps=3, async_checkpoints=False))
    wd = str(tmp_path_factory.mktemp("run"))
    model = factory.build_model(c.model)
    data = build_data(c.data.source, vocab_size=512, seq_len=32, batch_size=8, workdir=wd,
                      seed=c.seed, heldout_fraction=c.data.heldout_fraction)  # fmt: skip
    digest = hashlib.sha256(open(os.path.join(wd, "tokenizer.model"), "rb").read()).hexdigest()
    params = {}
    with Checkpointer(wd, keep=None, async_save=False) as ckpt:
        for step in (1, 2):
            state = _state(model, c, step)
            meta = {"step": step, "tokens_seen": step * 256, "tokenizer_sha256": digest}
            ckpt.save(step, state, data.train.get_state(), c.to_dict(), meta, force=True)
            params[step] = jax.device_get(state.params)
    return wd, params


@pytest.fixture
def run(base, tmp_path):
    wd = str(tmp_path / "run")
    shutil.copytree(base[0], wd)
    return wd, base[1], os.path.join(wd, "checkpoints", "2")


def _flip_largest_data_file(step_dir):
    files = [os.path.join(d, f) for d, _, fs in os.walk(step_dir) for f in fs]
    path = max((f for f in files if f"{os.sep}d{os.sep}" in f), key=os.path.getsize)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x01
    open(path, "wb").write(data)


def _assert_params(got, want):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _listing(root):
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, ds, fs in os.walk(root)
                  for n in ds + fs)  # fmt: skip


# ----------------------------------------------------------------- case 1: damaged weights
def test_a_reader_never_uses_a_damaged_step_and_says_which_it_used(run, capsys):
    wd, params, step_dir = run
    _flip_largest_data_file(step_dir)
    before = _listing(wd)
    restored = load_run(wd)
    assert restored.step == 1
    _assert_params(restored.params, params[1])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("using checkpoint step 1 of ")
    assert "skipped damaged step 2: checksum mismatch" in err[0]
    assert _listing(wd) == before  # a reader moves and deletes nothing


def test_a_reader_given_a_damaged_step_is_one_line(run):
    wd, _, step_dir = run
    _flip_largest_data_file(step_dir)
    with pytest.raises(CheckpointError, match="checkpoint step 2 in .* is damaged: checksum"):
        load_run(wd, 2)


def test_a_reader_with_every_step_damaged_is_one_line_and_moves_nothing(run):
    wd, _, step_dir = run
    _flip_largest_data_file(step_dir)
    _flip_largest_data_file(os.path.join(wd, "checkpoints", "1"))
    before = _listing(wd)
    with pytest.raises(CheckpointError, match="no readable checkpoint in") as e:
        load_run(wd)
    assert "\n" not in str(e.value) and _listing(wd) == before


def test_export_of_a_run_with_a_damaged_newest_step_exports_the_good_one(run, tmp_path):
    wd, params, step_dir = run
    _flip_largest_data_file(step_dir)
    out = str(tmp_path / "model")
    assert export(wd, out)["step"] == 1
    _assert_params(load(out).params, params[1])


# ----------------------------------------------------------------- case 2: one trainer
def test_a_second_trainer_is_refused_and_deletes_no_unfinished_save(run, caplog):
    wd, _, _ = run
    first = Checkpointer(wd, keep=None, async_save=False)
    unfinished = os.path.join(wd, "checkpoints", "3.orbax-checkpoint-tmp-1")
    os.makedirs(os.path.join(unfinished, "state"))  # the first trainer's save in progress
    try:
        with pytest.raises(CheckpointError, match="is in use by another trainer") as e:
            Checkpointer(wd, keep=None, async_save=False)
        assert f"pid {os.getpid()}" in str(e.value) and "host " in str(e.value)
        load_run(wd)  # a reader needs no lock, and removes nothing
        assert os.path.isdir(unfinished)
    finally:
        first.close()
    Checkpointer(wd, keep=None).close()  # the lock holder cleans up: orbax's tmp name
    assert not os.path.exists(unfinished)


def test_a_stale_lock_of_a_killed_trainer_is_taken_over_with_a_warning(run, caplog):
    wd, _, _ = run
    gone = {"host": "elsewhere", "pid": 4242, "started": 1.0, "heartbeat": 1.0}
    with open(os.path.join(wd, ".gpn_jax.lock"), "w") as f:
        json.dump(gone, f)  # a file, but no flock: the kernel dropped it when the run died
    with caplog.at_level(logging.WARNING), Checkpointer(wd, keep=None):
        pass
    said = [r.getMessage() for r in caplog.records if "taking over the workdir lock" in r.message]
    assert len(said) == 1 and "host elsewhere, pid 4242" in said[0]


def test_the_lock_of_a_trainer_killed_with_sigkill_is_taken_over(tmp_path, caplog):
    """Across processes: the holder is refused to others while alive, and its lock is taken
    over (with a warning naming it) once `kill -9` ended it."""
    import signal
    import subprocess
    import sys

    from gpn_jax.io import lock

    code = (
        "import sys, time; from gpn_jax.io import lock; "
        f"lock.acquire({str(tmp_path)!r}); print('held', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CheckpointError, match=f"pid {holder.pid}, started "):
            lock.acquire(str(tmp_path))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with caplog.at_level(logging.WARNING):
        lock.acquire(str(tmp_path)).release()
    assert f"pid {holder.pid}" in caplog.text and "taking over the workdir lock" in caplog.text


# ----------------------------------------------------------------- case 3: user files kept
def test_re_export_keeps_the_users_files(run, tmp_path):
    wd, _, _ = run
    out = tmp_path / "model"
    export(wd, str(out))
    (out / "NOTES.md").write_text("mine")
    (out / ".git").mkdir()
    (out / ".git" / "HEAD").write_text("ref")
    export(wd, str(out))  # an earlier export of the same run: no --overwrite needed
    assert (out / "NOTES.md").read_text() == "mine" and (out / ".git" / "HEAD").exists()
    load(str(out))


def test_overwrite_never_replaces_a_file_the_export_did_not_write(run, tmp_path):
    wd, _, _ = run
    out = tmp_path / "mine"
    out.mkdir()
    (out / "README.md").write_text("my notes")
    with pytest.raises(ValueError, match="README.md exists and was not written by gpn_jax"):
        export(wd, str(out), overwrite=True)
    assert os.listdir(out) == ["README.md"] and (out / "README.md").read_text() == "my notes"
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".mine.")]


# ----------------------------------------------------------------- case 4: special files
def _load_in_thread(wd, unblock):
    """load_run(wd) in a thread; fails (after unblocking it) if it hangs."""
    box = {}
    thread = threading.Thread(
        target=lambda: box.update(out=_try(lambda: load_run(wd))), daemon=True
    )
    thread.start()
    thread.join(60)
    if thread.is_alive():
        unblock()
        thread.join(10)
        pytest.fail("load_run hung on a special file")
    return box["out"]


def _try(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - returned for the test to inspect
        return e


@pytest.mark.parametrize("name", ["meta/metadata", "checksums/metadata", "state/_METADATA"])
def test_a_fifo_in_a_step_is_damage_not_a_hang(run, name, capsys):
    wd, params, step_dir = run
    path = os.path.join(step_dir, name)
    os.remove(path)
    os.mkfifo(path)

    def unblock():
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)

    restored = _load_in_thread(wd, unblock)
    assert not isinstance(restored, Exception), restored
    assert restored.step == 1 and "is not a regular file" in capsys.readouterr().err


def test_a_fifo_as_checkpoint_metadata_is_one_line_not_a_hang(run):
    """orbax itself reads every step's `_CHECKPOINT_METADATA` when a manager opens: that step
    cannot be skipped, so the reader stops in one line naming it."""
    wd, _, step_dir = run
    path = os.path.join(step_dir, "_CHECKPOINT_METADATA")
    os.remove(path)
    os.mkfifo(path)
    err = _load_in_thread(wd, lambda: os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK)))
    assert isinstance(err, CheckpointError) and "\n" not in str(err)
    assert str(err).startswith(f"{path} is a FIFO: step 2 is damaged; move {step_dir} aside")


def test_a_link_out_of_the_step_is_damage(run, capsys):
    """A metadata file replaced by a symlink to an identical copy outside the step (a link to
    /dev/zero the same way: never followed, so never read without end)."""
    wd, _, step_dir = run
    path = os.path.join(step_dir, "checksums", "metadata")
    outside = os.path.join(wd, "outside-copy")
    shutil.copy(path, outside)
    os.remove(path)
    os.symlink(outside, path)
    assert load_run(wd).step == 1
    assert "is a link that leaves the step" in capsys.readouterr().err


def test_a_link_to_dev_zero_is_damage(run, capsys):
    wd, _, step_dir = run
    path = os.path.join(step_dir, "state", "_METADATA")
    os.remove(path)
    os.symlink("/dev/zero", path)
    assert load_run(wd).step == 1
    assert "is a link that leaves the step" in capsys.readouterr().err


# ----------------------------------------------------------------- case 5: step name
def test_a_step_copied_under_another_name_is_damage_and_resume_falls_back(run, caplog):
    wd, params, step_dir = run
    huge = os.path.join(wd, "checkpoints", "99999999999999999999")
    shutil.copytree(step_dir, huge)
    with Checkpointer(wd, keep=None, async_save=False) as ck, caplog.at_level(logging.WARNING):
        step, state, *_ = ck.restore_latest_good(_abstract(wd), quarantine=True)
    assert step == 2
    _assert_params(state.params if hasattr(state, "params") else state["params"], params[2])
    warned = [r.getMessage() for r in caplog.records if "falling back" in r.getMessage()]
    assert len(warned) == 1 and "holds step 2" in warned[0]
    assert not os.path.exists(huge) and os.path.isdir(huge + ".unreadable-0")


def _abstract(wd):
    c = gpn_m_tiny.get_config()
    model = factory.build_model(c.model)
    return jax.eval_shape(lambda: _state(model, c, 0))


# ----------------------------------------------------------------- case 7: tokenizer
def test_a_swapped_tokenizer_is_one_line_naming_the_file(run):
    wd, _, _ = run
    path = os.path.join(wd, "tokenizer.model")
    train_tokenizer(embedded_corpus()[:20], 400, path)
    with pytest.raises(CheckpointError, match="was trained with sha256") as e:
        load_run(wd)
    assert str(e.value).startswith(path) and "\n" not in str(e.value)


# ----------------------------------------------------------------- case 8: final_metrics.json
def test_a_directory_named_final_metrics_is_one_line_before_training(tmp_path):
    from gpn_jax.training.loop import prepare_workdir

    (tmp_path / "final_metrics.json").mkdir()
    with pytest.raises(ValueError, match="final_metrics.json is not a regular file; move it"):
        prepare_workdir(str(tmp_path))


@pytest.mark.parametrize("final", ["dir", {"step": 2, "heldout_tokens": 0}])
def test_export_of_a_run_with_odd_final_metrics_says_not_recorded(run, tmp_path, final):
    wd, _, _ = run
    path = os.path.join(wd, "final_metrics.json")
    if final == "dir":
        os.mkdir(path)
    else:
        json.dump(final, open(path, "w"))
    export(wd, str(tmp_path / "model"))
    assert "held-out PPL: not recorded" in (tmp_path / "model" / "README.md").read_text()


# ----------------------------------------------------------------- case 9: swapped tensors
def test_two_same_shape_tensors_with_swapped_offsets_do_not_load(run, tmp_path):
    wd, _, _ = run
    out = str(tmp_path / "model")
    export(wd, out)
    path = os.path.join(out, "model.safetensors")
    blob = open(path, "rb").read()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + n])
    by_shape = {}
    for name, entry in header.items():
        if name != "__metadata__":
            by_shape.setdefault((tuple(entry["shape"]), entry["dtype"]), []).append(name)
    a, b = next(names for names in by_shape.values() if len(names) >= 2)[:2]
    header[a]["data_offsets"], header[b]["data_offsets"] = (
        header[b]["data_offsets"],
        header[a]["data_offsets"],
    )
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    open(path, "wb").write(len(raw).to_bytes(8, "little") + raw + blob[8 + n :])
    with pytest.raises(ValueError, match="sha256") as e:
        load(out)
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------- case 2 on an object store
def test_the_object_store_lock_refuses_a_live_holder_and_takes_over_a_silent_one(
    tmp_path, monkeypatch, caplog
):
    """The `gs://` protocol (create if absent, read back, heartbeat age), run through epath on
    a local folder standing in for the bucket."""
    import time

    from gpn_jax.io import lock

    monkeypatch.setattr(lock.paths, "is_remote", lambda p: True)
    path = tmp_path / lock.LOCK_FILE
    held = lock.acquire(str(tmp_path))
    with pytest.raises(CheckpointError, match=f"pid {os.getpid()}, started "):
        lock.acquire(str(tmp_path))
    held.release()
    assert not path.exists()  # released: the object is gone
    silent = {"host": "elsewhere", "pid": 4242, "started": 1.0}
    path.write_text(json.dumps(silent | {"heartbeat": time.time() - lock.STALE_S - 1}))
    with caplog.at_level(logging.WARNING):
        lock.acquire(str(tmp_path)).release()
    assert "taking over the workdir lock" in caplog.text and "pid 4242" in caplog.text


def test_init_from_a_fifo_is_one_line_not_a_hang(tmp_path):
    """`train.init_from=paper:` reads the paper's pickle as a regular file only."""
    from gpn_jax.checkpoints import paper_pickle

    path = str(tmp_path / "checkpoint.pkl")
    os.mkfifo(path)
    box = {}
    thread = threading.Thread(
        target=lambda: box.update(out=_try(lambda: paper_pickle.load(path))), daemon=True
    )
    thread.start()
    thread.join(60)
    if thread.is_alive():
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("paper_pickle.load hung on a FIFO")
    assert isinstance(box["out"], ValueError) and "is a FIFO" in str(box["out"])


# ------------------------------------------------- issue 83: live runs and a missing --step
def test_a_reader_lists_the_steps_again_when_its_step_vanishes(run, tmp_path, monkeypatch):
    """A live run with keep_checkpoints=1: the reader listed step 1 alone, and while it reads
    it the trainer commits step 2 and deletes step 1. The reader restores step 2."""
    wd, params, step_dir = run
    hidden = str(tmp_path / "step2-being-written")
    shutil.move(step_dir, hidden)  # step 2 not yet committed when the reader lists the steps
    real = Checkpointer._check_files

    def trainer_rotates(self, step):
        if step == 1 and os.path.isdir(hidden):
            shutil.move(hidden, step_dir)  # the trainer commits step 2 ...
            shutil.rmtree(os.path.join(wd, "checkpoints", "1"))  # ... and deletes step 1
        return real(self, step)

    monkeypatch.setattr(Checkpointer, "_check_files", trainer_rotates)
    restored = load_run(wd)
    assert restored.step == 2
    _assert_params(restored.params, params[2])


def test_a_missing_step_says_so_and_lists_the_steps(run):
    wd, _, _ = run
    with pytest.raises(CheckpointError) as e:
        load_run(wd, 5)
    assert (
        str(e.value)
        == f"--step=5: {os.path.join(wd, 'checkpoints')} has no step 5; its steps are 1, 2"
    )


# ------------------------------------------------- a config saved before a field existed
def _older(config: dict) -> dict:
    """`config` as a version before the logging block, train.carry_state and
    data.train_layout saved it."""
    config = json.loads(json.dumps(config))
    del config["logging"], config["train"]["carry_state"], config["data"]["train_layout"]
    return config


def test_a_run_saved_before_a_config_field_reads_with_its_default(run, tmp_path, monkeypatch):
    """Restore and export complete an older config from the declarations
    (`configs.blocks.complete`), so their readers read `config.train.carry_state` as any
    other; the data is rebuilt as the run built it."""
    wd, params, _ = run
    read = Checkpointer.read_config
    monkeypatch.setattr(Checkpointer, "read_config", lambda self, s: _older(read(self, s)))
    restored = load_run(wd)
    _assert_params(restored.params, params[2])
    want = (False, "jsonl,tensorboard", "")
    old = restored.config
    assert (old.train.carry_state, old.logging.writers, old.data.train_layout) == want
    assert DataConfig.of(old).train_layout == "shuffled"
    out = str(tmp_path / "model")
    export(wd, out)
    path = os.path.join(out, "config.json")
    record = json.load(open(path))
    json.dump(record | {"config": _older(record["config"])}, open(path, "w"))
    old = load(out).config
    assert (old.train.carry_state, old.logging.writers, old.data.train_layout) == want
