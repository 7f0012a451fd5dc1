"""Benchmark working directories: a fresh private one by default, no planted file followed."""

import os
import stat

import pytest

from gpn_jax.benchmarks import workdirs
from gpn_jax.io.regular import NotRegularFileError


def test_default_is_a_new_private_directory():
    a, b = workdirs.prepare("", "gpn-bench"), workdirs.prepare("", "gpn-bench")
    try:
        assert a != b and os.path.basename(a).startswith("gpn-bench-")
        assert stat.S_IMODE(os.stat(a).st_mode) == 0o700
    finally:
        os.rmdir(a)
        os.rmdir(b)


def test_given_directory_is_created_and_a_symlink_refused(tmp_path):
    made = workdirs.prepare(str(tmp_path / "new"), "gpn-bench")
    assert os.path.isdir(made)
    (tmp_path / "target").mkdir()
    os.symlink(tmp_path / "target", tmp_path / "link")
    with pytest.raises(ValueError, match=r"link is a symbolic link; pass the directory"):
        workdirs.prepare(str(tmp_path / "link"), "gpn-bench")


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo"])
def test_open_new_writes_only_its_own_regular_file(tmp_path, kind):
    """A symlink, a hard link (a `cp -al` snapshot) or a FIFO at the name is refused in one
    line naming it, and the other file is untouched (issue 83: through gpn_jax.io)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    log = tmp_path / "prepare.log"
    if kind == "symlink":
        os.symlink(victim, log)
    elif kind == "hardlink":
        os.link(victim, log)
    else:
        os.mkfifo(log)
    with pytest.raises(NotRegularFileError, match=r"prepare\.log: (is a|has 1 other)") as e:
        workdirs.open_new(str(log), "w+")
    assert "\n" not in str(e.value)
    assert victim.read_text() == "keep"


def test_open_new_writes_a_private_file_emptied_first(tmp_path):
    out = tmp_path / "out.json"
    out.write_text("an older, longer result")
    with workdirs.open_new(str(out)) as f:
        f.write("{}")
    assert out.read_text() == "{}"
    with workdirs.open_new(str(tmp_path / "new.json")) as f:
        f.write("{}")
    assert stat.S_IMODE(os.stat(tmp_path / "new.json").st_mode) == 0o600
    with workdirs.open_new(str(tmp_path / "log"), "w+") as f:
        f.write("line\n")
        f.seek(0)
        assert f.read() == "line\n"
