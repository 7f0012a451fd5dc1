"""Run-directory paths that may be local directories or object-store URLs (`gs://bucket/run`).

A multi-host run shares one workdir. On a gcsfuse mount directory renames are not atomic, so
orbax's commit-by-rename does not hold there; given a `gs://` URL instead, orbax and
tensorstore write the object store natively (orbax then commits a step with a
`commit_success.txt` object instead of a rename). Everything else the trainer writes is small
(metrics, final metrics, the tokenizer, write probes, data caches) and goes through
`etils.epath`, which reaches `gs://` via fsspec/gcsfs. Local paths keep plain `os` calls.

Temporary and probe names carry the host index, the pid and a random suffix, so hosts that
start at once never touch each other's files.
"""

import contextlib
import io
import os
import re
import secrets
import sys
import time

from etils import epath

from gpn_jax.io.regular import naming, open_for_writing

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_remote(path) -> bool:
    """True for an object-store URL (`gs://...`, `s3://...`): a scheme, then `://`, at the
    start (a local path holding `http://` further on is a local path)."""
    return _URL.match(os.fspath(path)) is not None


def absolute(path) -> str:
    """A local path made absolute (`~` expanded); a URL unchanged (minus a trailing slash)."""
    path = os.fspath(path)
    if is_remote(path):
        return path.rstrip("/")
    return os.path.abspath(os.path.expanduser(path))


def join(base, *names) -> str:
    """`base/name/...` for a local path or a URL."""
    if is_remote(base):
        return os.fspath(epath.Path(base).joinpath(*names))
    return os.path.join(base, *names)


def unique_suffix() -> str:
    """`<host index>-<pid>-<random>`: distinct across hosts, processes and calls.

    The host index is read only once `jax.distributed` is up (never initialising a backend
    from a file helper); the random part keeps names distinct even without it. JAX is not
    imported here (a process that has not imported it runs no distributed job): `prepare`'s
    tokenizing workers write through these helpers without paying JAX's import.
    """
    jax = sys.modules.get("jax")
    host = jax.process_index() if jax is not None and jax.distributed.is_initialized() else 0
    return f"{host}-{os.getpid()}-{secrets.token_hex(4)}"


# The name `atomic_open` gives its temporary file: `<path>.tmp-<unique_suffix()>`.
_TEMPORARY = re.compile(r"\.tmp-[0-9]+-[0-9]+-[0-9a-f]+$")


def is_temporary(name: str) -> bool:
    """True for the name of a temporary file `atomic_open` leaves when its writer is killed."""
    return _TEMPORARY.search(name) is not None


def exists(path) -> bool:
    return epath.Path(path).exists() if is_remote(path) else os.path.exists(path)


def make_dirs(path) -> None:
    """Creates `path` and its parents (no-op where it exists; safe when hosts race)."""
    if is_remote(path):
        epath.Path(path).mkdir(parents=True, exist_ok=True)
    else:
        os.makedirs(path, exist_ok=True)


def probe_writable(directory) -> None:
    """Writes and removes a probe file under a name no other host or process uses.

    `os.access` lies for root and on read-only mounts; a real write does not. Raises OSError.
    """
    probe = epath.Path(join(directory, f".write_probe-{unique_suffix()}"))
    probe.write_bytes(b"ok")
    probe.unlink(missing_ok=True)


def read_bytes(path) -> bytes:
    return epath.Path(path).read_bytes()


@contextlib.contextmanager
def atomic_open(path):
    """A binary file to write `path` with: readers see the old or the new content, never a part.

    Local: a uniquely named temporary file renamed over `path` on success (atomic on POSIX;
    removed on failure). Object store: one object upload on close, which is atomic by itself
    (a rename there is a copy + delete).
    """
    if is_remote(path):
        with epath.Path(path).open("wb") as f:
            yield f
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{unique_suffix()}"
    try:  # a failed write (EFBIG, ENOSPC) names `path`, not the temporary file it removes
        with naming(path), open(tmp, "xb") as f:  # a new file: never through a name planted there
            yield f
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_bytes(path, data: bytes) -> None:
    """Writes `data` to `path` atomically (`atomic_open`)."""
    with atomic_open(path) as f:
        f.write(data)


class RewrittenObject:
    """An append-only file on an object store, where objects cannot be appended to.

    Keeps the whole content in memory and uploads it as one object on `flush()` (and on
    `write` when `min_interval_s` has passed since the last upload), so the stored object is
    always a complete prefix of what was written. Existing content is kept (append mode).
    Meant for small files: metrics rows, TensorBoard event files.
    """

    def __init__(self, path: str, min_interval_s: float = 10.0, text: bool = False):
        self.path, self._text, self._interval = epath.Path(path), text, min_interval_s
        self._buf = io.BytesIO()
        if self.path.exists():
            self._buf.write(self.path.read_bytes())
        self._uploaded, self._dirty, self.closed = time.monotonic(), False, False

    def write(self, data) -> None:
        self._buf.write(data.encode() if isinstance(data, str) else data)
        self._dirty = True
        if time.monotonic() - self._uploaded >= self._interval:
            self.flush()

    def flush(self) -> None:
        if self._dirty:
            self.path.write_bytes(self._buf.getvalue())
            self._uploaded, self._dirty = time.monotonic(), False

    def close(self) -> None:
        if not self.closed:
            self.flush()
            self.closed = True


def open_append(path: str):
    """A line-buffered text file opened for appending (`regular.open_for_writing`: never
    through a link), or a `RewrittenObject` for a URL."""
    if is_remote(path):
        return RewrittenObject(path, text=True)
    return open_for_writing(path, append=True, text=True)  # no link, FIFO or device


class _TensorBoardFactory:
    """tensorboardX writer factory: event files on an object store through epath."""

    def open(self, path):
        return RewrittenObject(path, min_interval_s=float("inf"))  # uploads on its flush()

    def directory_check(self, path):
        make_dirs(path)


def register_tensorboard(path) -> None:
    """Makes tensorboardX write `path`'s scheme through epath (a no-op for local paths).

    tensorboardX's own gs:// writer needs google-cloud-storage; epath (with gcsfs) is what
    the rest of the trainer already uses.
    """
    if is_remote(path):
        from tensorboardX import record_writer

        record_writer.register_writer_factory(os.fspath(path).split(":")[0], _TensorBoardFactory())
