"""Writes into a run or output folder reach that folder's own regular files only (issue 83):
never through a symlink planted at a file's name, never into a file with other hard links
(a `cp -al` snapshot), never into a FIFO or device; the refusal is one line naming the path
and nothing is written to the other file."""

import os

import pytest

from gpn_jax.data.prepare.shards import ShardWriter
from gpn_jax.io import lock, paths
from gpn_jax.io.regular import NotRegularFileError, open_for_writing
from gpn_jax.training.metric_writer import MetricWriter

VICTIM = b"the user's notes\n"


def _plant(tmp_path, name: str, kind: str) -> tuple[str, str | None]:
    """(path of `name` in a fresh run folder, path of the victim file) with `kind` at `name`."""
    run = tmp_path / "run"
    run.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    path = run / name
    if kind == "symlink":
        path.symlink_to(victim)
    elif kind == "hardlink":
        os.link(victim, path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/full")
    elif kind == "directory":
        path.mkdir()
    return str(path), str(victim)


KINDS = ["symlink", "hardlink", "fifo", "device", "directory"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("append", [False, True])
def test_open_for_writing_refuses_anything_but_the_folder_own_file(tmp_path, kind, append):
    path, victim = _plant(tmp_path, "out.bin", kind)
    with pytest.raises(NotRegularFileError) as e:
        open_for_writing(path, append=append)
    assert str(e.value).startswith(f"{path}: is ") or "hard link" in str(e.value)
    assert "\n" not in str(e.value)
    assert open(victim, "rb").read() == VICTIM


def test_open_for_writing_writes_a_new_or_own_file_with_the_umask_mode(tmp_path):
    path = tmp_path / "out.txt"
    old = os.umask(0o022)
    try:
        with open_for_writing(path, text=True) as f:
            f.write("one\n")
    finally:
        os.umask(old)
    assert (path.stat().st_mode & 0o777) == 0o644
    with open_for_writing(path, append=True, text=True) as f:
        f.write("two\n")
    assert path.read_text() == "one\ntwo\n"
    with open_for_writing(path) as f:  # not appending: emptied first
        f.write(b"3")
    assert path.read_bytes() == b"3"


@pytest.mark.parametrize("kind", ["hardlink", "symlink", "fifo"])
def test_the_workdir_lock_never_truncates_another_file(tmp_path, kind):
    path, victim = _plant(tmp_path, lock.LOCK_FILE, kind)
    with pytest.raises(OSError) as e:
        lock.acquire(os.path.dirname(path))
    assert path in str(e.value)
    assert open(victim, "rb").read() == VICTIM


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo", "device"])
def test_metrics_are_never_appended_through_a_link_or_into_a_special_file(tmp_path, kind):
    path, victim = _plant(tmp_path, "metrics.jsonl", kind)
    with pytest.raises(NotRegularFileError, match="metrics.jsonl: "):
        MetricWriter(os.path.dirname(path), writers=("jsonl",), info={"argv": ["x"]})
    assert open(victim, "rb").read() == VICTIM


def test_an_atomic_write_replaces_a_planted_link_instead_of_writing_through_it(tmp_path):
    path, victim = _plant(tmp_path, "config.json", "symlink")
    paths.write_bytes(path, b"{}")
    assert not os.path.islink(path) and open(path, "rb").read() == b"{}"
    assert open(victim, "rb").read() == VICTIM


def test_a_prepare_shard_is_never_appended_through_a_hard_link(tmp_path):
    path, victim = _plant(tmp_path, "data_0000.bin.partial", "hardlink")
    with pytest.raises(NotRegularFileError, match="hard link"):
        ShardWriter(os.path.dirname(path), "uint16", 8, 0)
    assert open(victim, "rb").read() == VICTIM
