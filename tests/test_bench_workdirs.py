"""Benchmark working directories: a fresh private one by default, no planted file followed."""

import os
import stat

import pytest

from gpn_jax.benchmarks import workdirs


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


def test_open_new_does_not_follow_a_planted_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    os.symlink(victim, tmp_path / "prepare.log")
    with pytest.raises(ValueError, match=r"prepare.log is a symbolic link"):
        workdirs.open_new(str(tmp_path / "prepare.log"), "w+")
    assert victim.read_text() == "keep"
    with workdirs.open_new(str(tmp_path / "out.json")) as f:
        f.write("{}")
    assert (tmp_path / "out.json").read_text() == "{}"
    assert stat.S_IMODE(os.stat(tmp_path / "out.json").st_mode) == 0o600
