"""Every OS-level failure reaching a command line is one line with a non-zero exit (issue 51,
case 8): disk full (ENOSPC, simulated by a write that raises it) and a file-size limit (EFBIG,
a real `RLIMIT_FSIZE` in a child process) in gpn-prepare, the data cache and export;
permission, is-a-directory and a name too long anywhere."""

import errno
import json
import os
import resource
import signal
import subprocess
import sys

import numpy as np
import pytest

from gpn_jax.data.pipeline import build_data
from gpn_jax.data.prepare import shards
from gpn_jax.data.prepare.run import Options, prepare_corpus
from gpn_jax.data.text_sources import embedded_corpus
from gpn_jax.data.tokenizer import train_tokenizer
from gpn_jax.io import cli, files, paths, regular
from tests.environment import one_device_env
from tests.helpers.training import save_tiny_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
V = 512


def one_line(capsys, prog: str, *parts: str) -> str:
    """The single stderr line of a `run_or_exit` that exited 1, containing `parts`."""
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def exits_1(fn, *args, **kwargs):
    with pytest.raises(SystemExit) as exit_info:
        cli.run_or_exit(fn, *args, **kwargs)
    assert exit_info.value.code == 1


def _raise(error):
    raise error


@pytest.mark.parametrize(
    "error, text",
    [
        (OSError(errno.ENOSPC, "No space left on device", "/d/f"), "/d/f: No space left on device (ENOSPC); free some space"),
        (OSError(errno.EFBIG, "File too large", "/d/f"), "/d/f: File too large (EFBIG); the file exceeds"),
        (OSError(errno.EDQUOT, "Disk quota exceeded", "/d/f"), "(EDQUOT); the disk quota"),
        (OSError(errno.EROFS, "Read-only file system", "/d/f"), "(EROFS); the file system is read-only"),
        (OSError(errno.EIO, "Input/output error", "/d/f"), "/d/f: Input/output error (EIO)"),
        (OSError("a plain message"), "a plain message"),
        (RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),
         "Error while serializing: No space left on device (ENOSPC); free some space"),
    ],
)  # fmt: skip
def test_any_os_error_is_one_line_naming_the_file_and_the_fix(capsys, error, text):
    exits_1(_raise, error, prog="gpn-x")
    one_line(capsys, "gpn-x", text)


def test_other_errors_keep_their_traceback():
    """A bug is not a user error: it is raised, not printed in one line."""
    with pytest.raises(RuntimeError, match="a bug"):
        cli.run_or_exit(_raise, RuntimeError("a bug"), prog="gpn-x")


def test_real_os_errors_are_one_line(tmp_path, capsys):
    """Is-a-directory, a name too long, a permission error and a missing parent, as the OS
    raises them."""

    def write(path):
        with open(path, "wb") as f:
            f.write(b"x")

    exits_1(write, tmp_path, prog="gpn-x")
    one_line(capsys, "gpn-x", f"{tmp_path}: Is a directory (EISDIR); give a file path")
    exits_1(write, tmp_path / ("n" * 5000), prog="gpn-x")
    one_line(capsys, "gpn-x", "File name too long (ENAMETOOLONG); use a shorter path")
    exits_1(write, tmp_path / "a_file" / "x", prog="gpn-x")
    one_line(capsys, "gpn-x", "No such file or directory (ENOENT)")
    if os.getuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        exits_1(write, locked / "x", prog="gpn-x")
        one_line(capsys, "gpn-x", "Permission denied (EACCES)")


class _FullDisk:
    """A binary file whose writes fail with ENOSPC once the disk's `room` (a one-item list
    shared by every file opened on it) is used up."""

    def __init__(self, path, mode, room: list):
        self._f, self._path, self._room = open(path, mode), path, room  # noqa: SIM115

    def write(self, data):
        if len(data) > self._room[0]:
            raise OSError(errno.ENOSPC, "No space left on device", self._path)
        self._room[0] -= len(data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tok") / "tok.model")
    train_tokenizer(embedded_corpus(), V, path)
    return path


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "c.jsonl"
    docs = [f"doc {i}: " + t[:1500] for i, t in enumerate(embedded_corpus()[:60])]
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return str(path)


def options(jsonl, out, tokenizer_path) -> Options:
    return Options(input=jsonl, output=str(out), tokenizer_path=tokenizer_path, workers=1,
                   heldout_fraction=0.1, shard_tokens=4000, chunk_records=5, progress=False)  # fmt: skip


def test_disk_full_in_prepare_is_one_line_and_a_rerun_finishes(
    tmp_path, jsonl, tokenizer_path, capsys, monkeypatch
):
    reference = prepare_corpus(options(jsonl, tmp_path / "ref", tokenizer_path))
    capsys.readouterr()
    out = tmp_path / "out"
    room = [20_000]  # bytes: the disk fills in the third of about ten shards

    def full_disk(path, append=False):  # what `shards` opens its files with
        return _FullDisk(path, "ab" if append else "wb", room)

    monkeypatch.setattr(shards, "open_for_writing", full_disk)
    exits_1(prepare_corpus, options(jsonl, out, tokenizer_path), prog="gpn-prepare")
    one_line(capsys, "gpn-prepare", ".bin.partial: No space left on device (ENOSPC)")
    assert not (out / "manifest.json").exists()
    monkeypatch.undo()
    assert prepare_corpus(options(jsonl, out, tokenizer_path)) == reference  # space freed: resumes
    for split in reference["splits"].values():
        for shard in split["shards"]:
            assert (out / shard["file"]).read_bytes() == (
                tmp_path / "ref" / shard["file"]
            ).read_bytes()


def test_disk_full_in_the_data_cache_is_one_line_and_leaves_nothing(
    tmp_path, tokenizer_path, capsys, monkeypatch
):
    cache = tmp_path / "cache"
    monkeypatch.setattr(paths, "open", lambda p, m: _FullDisk(p, m, [0]), raising=False)
    build = dict(vocab_size=V, seq_len=8, batch_size=2, tokenizer_path=tokenizer_path,
                 cache_dir=str(cache), heldout_fraction=0.1)  # fmt: skip
    exits_1(build_data, "embedded", **build, prog="gpn-train")
    one_line(capsys, "gpn-train", f"{cache}/train-", "No space left on device (ENOSPC)")
    assert not cache.exists() or not os.listdir(cache)  # no partial cache file


@pytest.fixture
def file_size_limit():
    """Writes past 16 KiB in this process fail with EFBIG, as on a full or quota'd disk
    (SIGXFSZ ignored; the limit is lifted when the test ends)."""
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024, old_limit[1]))
    yield
    resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
    signal.signal(signal.SIGXFSZ, old_handler)


def _write_through(path: str, how: str) -> None:
    big = np.arange(40_000, dtype=np.uint16)  # 80 KB: past the limit
    if how == "data cache":
        files.save_cache(path, big)
    elif how == "atomic":
        paths.write_bytes(path, big.tobytes())
    elif how == "private":
        files.atomic_write(path, big.tobytes(), private=True)
    elif how in ("append", "truncate"):
        with regular.open_for_writing(path, append=how == "append") as f:
            f.write(big.tobytes())
    else:  # a run's text file, line-buffered (metrics.jsonl)
        with regular.open_for_writing(path, append=True, text=True) as f:
            for _ in range(2000):
                f.write(json.dumps({"loss": 1.0, "step": 1}) + "\n")


@pytest.mark.parametrize("how", ["data cache", "atomic", "private", "append", "truncate", "text"])
def test_a_real_file_size_limit_names_the_file_being_written(
    tmp_path, capsys, file_size_limit, how
):
    """EFBIG from a real RLIMIT_FSIZE, raised by a write (which names no file), is one line
    naming the file through every writer in gpn_jax.io; an atomic writer leaves nothing."""
    path = str(tmp_path / "train-0.npy")
    exits_1(_write_through, path, how, prog="gpn-train")
    one_line(capsys, "gpn-train", f"{path}: File too large (EFBIG); the file exceeds")
    if how in ("data cache", "atomic", "private"):
        assert os.listdir(tmp_path) == []


def test_a_real_file_size_limit_in_the_data_cache_is_one_line(
    tmp_path, tokenizer_path, capsys, file_size_limit
):
    cache = tmp_path / "cache"
    build = dict(vocab_size=V, seq_len=8, batch_size=2, tokenizer_path=tokenizer_path,
                 cache_dir=str(cache), heldout_fraction=0.1)  # fmt: skip
    exits_1(build_data, "embedded", **build, prog="gpn-train")
    line = one_line(capsys, "gpn-train", f"{cache}/", ": File too large (EFBIG); the file exceeds")
    assert line.split(": File too large")[0].endswith(".npy"), line
    assert not [n for n in os.listdir(cache) if n.endswith(".npy")]


# Sets RLIMIT_FSIZE, then becomes `python -m module args` (no preexec_fn: this process runs
# JAX's threads, and forking with them is unsafe).
_LAUNCH = (
    "import os, resource, sys; n = int(sys.argv[1]) * 1024; "
    "resource.setrlimit(resource.RLIMIT_FSIZE, (n, n)); "
    "os.execv(sys.executable, [sys.executable, '-m', *sys.argv[2:]])"
)


def _child(module: str, *args, kib: int):
    """`python -m module args` with every file it writes capped at `kib` KiB (EFBIG past it;
    Python ignores SIGXFSZ)."""
    env = one_device_env(PYTHONPATH=ROOT)
    cmd = [sys.executable, "-c", _LAUNCH, str(kib), module, *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def assert_one_line_exit(proc, prog: str, text: str):
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), proc.stderr[-3000:]
    assert text in lines[0], lines[0]


def test_a_file_size_limit_in_prepare_is_one_line(tmp_path, jsonl, tokenizer_path):
    proc = _child("gpn_jax.prepare", f"--input={jsonl}", f"--output={tmp_path / 'out'}",
                  f"--tokenizer_path={tokenizer_path}", "--workers=1", "--shard_tokens=100000",
                  "--noprogress", kib=24)  # fmt: skip
    assert_one_line_exit(proc, "gpn-prepare", ".bin.partial: File too large (EFBIG)")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A gpn_m_tiny checkpoint at step 1, saved as training saves one."""
    wd = str(tmp_path_factory.mktemp("run"))
    save_tiny_run(wd, 1)
    return wd


def test_a_file_size_limit_in_export_is_one_line(tmp_path, workdir):
    """model.safetensors (about 180 KiB) is over the 64 KiB limit."""
    out = tmp_path / "model"
    proc = _child("gpn_jax.export", f"--workdir={workdir}", f"--out={out}", kib=64)
    assert_one_line_exit(proc, "gpn-export", "(EFBIG)")


def test_a_nan_size_in_an_exported_config_is_one_line(tmp_path, workdir):
    from gpn_jax.checkpoints.model_dir import load_model_dir
    from gpn_jax.export import export

    out = tmp_path / "model"
    export(workdir, str(out))
    config = json.loads((out / "config.json").read_text())
    config["config"]["model"]["vocab_size"] = float("nan")
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="config.json") as err:
        load_model_dir(str(out))
    assert "\n" not in str(err.value)


def test_a_failed_write_of_the_workdir_lock_names_the_lock_file(tmp_path, monkeypatch):
    """The lock's holder record is written with os.pwrite, whose error names no file (EFBIG
    past `ulimit -f`): the one line must still say which file."""
    from gpn_jax.io import lock

    def full(fd, data, offset):
        raise OSError(errno.EFBIG, "File too large")

    monkeypatch.setattr(lock.os, "pwrite", full)
    with pytest.raises(OSError) as e:
        lock.acquire(str(tmp_path))
    assert e.value.filename == str(tmp_path / ".gpn_jax.lock") and e.value.errno == errno.EFBIG
