"""One trainer per workdir (one `gpn-prepare` per `--output`): an advisory lock held for a
run's life.

A second trainer on the same workdir would delete the first one's in-progress save (only
the lock holder removes unfinished saves) and interleave checkpoints with it. The lock is
`<workdir>/.gpn_jax.lock`, holding JSON {"host", "pid", "started", "heartbeat"}:

* local (and any mounted) workdir: `fcntl.flock(LOCK_EX | LOCK_NB)` on that file, kept open
  for the run's life. The kernel releases it when the process dies, however it dies (kill -9
  too), so a run killed before it could release leaves a file naming it but no lock: the
  next trainer takes it over and says so. (On NFS, flock works where the server supports
  byte-range locks, NFSv4; on filesystems without locking the open fails loudly.)
* `gs://` workdir: an object. Object stores have no flock, and etils.epath exposes no
  generation-match precondition, so the lock is "create if absent, then read back": the
  writer re-reads the object and owns the lock only if it still holds its own token. A
  background thread rewrites the heartbeat every `HEARTBEAT_S`; an object whose heartbeat
  is older than `STALE_S` belongs to a dead run and is taken over with a warning. Two
  trainers started within the same second on the same `gs://` workdir can both pass the
  read-back (the store's last write wins, and one of them is refused at its next heartbeat).

Readers (evaluate, generate, export, analyze) take no lock and delete nothing.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid

from etils import epath

from gpn_jax.io import paths
from gpn_jax.io.errors import CheckpointError
from gpn_jax.io.regular import NotRegularFileError, naming, open_fd_for_writing

log = logging.getLogger(__name__)

LOCK_FILE = ".gpn_jax.lock"
HEARTBEAT_S, STALE_S = 60.0, 600.0
_MAX_LOCK_BYTES = 4096


def _holder_record(token: str) -> dict:
    now = time.time()
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": now,
        "heartbeat": now,
        "token": token,
    }


def _parse(raw: bytes) -> dict:
    """The holder record in a lock file, {} if unreadable (a lock file is ours: no schema
    beyond what the refusal message names)."""
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _describe(holder: dict) -> str:
    started = holder.get("started")
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started))
        if isinstance(started, int | float) and 0 < started < 1e11
        else "an unknown time"
    )
    return f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, started {when}"


def _refusal(lock: WorkdirLock, holder: dict) -> CheckpointError:
    return CheckpointError(
        f"{lock.flag}={lock.workdir} is in use by another {lock.user} ({_describe(holder)}); "
        f"wait for it to finish or stop it, or give another {lock.flag}"
    )


class WorkdirLock:
    """The held lock of one workdir; `release()` (idempotent) gives it back."""

    def __init__(self, workdir: str, user: str = "trainer", flag: str = "--workdir"):
        self.workdir, self.user, self.flag = workdir, user, flag
        self.path = paths.join(workdir, LOCK_FILE)
        self._fd: int | None = None
        self._token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------- local: flock
    def _acquire_local(self) -> None:
        import fcntl

        try:  # no link, FIFO, device or hard-linked file: it is truncated below
            fd = open_fd_for_writing(self.path, os.O_RDWR, 0o644)
        except NotRegularFileError:
            raise
        except OSError as e:
            raise CheckpointError(
                f"cannot open the workdir lock {self.path}: {e.strerror or e}; remove it if it "
                "is not a regular file"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _parse(os.pread(fd, _MAX_LOCK_BYTES, 0))
            os.close(fd)
            raise _refusal(self, holder) from None
        except OSError as e:
            os.close(fd)
            raise CheckpointError(
                f"cannot lock {self.path}: {e.strerror or e} (the filesystem has no file locks); "
                "use a local disk or a gs:// workdir"
            ) from None
        stale = _parse(os.pread(fd, _MAX_LOCK_BYTES, 0))
        if stale:
            log.warning(
                "taking over the workdir lock of a run that is gone (%s): %s",
                _describe(stale),
                self.path,
            )
        with naming(self.path):  # a write error (EFBIG, ENOSPC) names the lock file
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(_holder_record(self._token)).encode(), 0)
        self._fd = fd

    def _release_local(self) -> None:
        import fcntl

        os.ftruncate(self._fd, 0)  # a clean exit leaves no holder to report as stale
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    # ------------------------------------------------------------- gs://: an object
    def _read_remote(self) -> dict | None:
        path = epath.Path(self.path)
        if not path.exists():
            return None
        return _parse(path.read_bytes()[:_MAX_LOCK_BYTES])

    def _write_remote(self, record: dict) -> None:
        epath.Path(self.path).write_bytes(json.dumps(record).encode())

    def _acquire_remote(self) -> None:
        holder = self._read_remote()
        if holder is not None:
            beat = holder.get("heartbeat")
            age = time.time() - beat if isinstance(beat, int | float) else float("inf")
            if age < STALE_S:
                raise _refusal(self, holder)
            log.warning(
                "taking over the workdir lock of a run that is gone (%s, no heartbeat for "
                "%.0f s): %s",
                _describe(holder),
                age,
                self.path,
            )
        self._record = _holder_record(self._token)
        self._write_remote(self._record)
        now = self._read_remote() or {}
        if now.get("token") != self._token:  # another trainer wrote after us: it holds it
            raise _refusal(self, now)
        self._thread = threading.Thread(target=self._heartbeat, daemon=True)
        self._thread.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                if (self._read_remote() or {}).get("token") != self._token:
                    log.error("the workdir lock %s was taken by another trainer", self.path)
                    return
                self._write_remote(self._record | {"heartbeat": time.time()})
            except OSError as e:  # a transient store error: the next beat tries again
                log.warning("workdir lock heartbeat failed: %s", e)

    def _release_remote(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if (self._read_remote() or {}).get("token") == self._token:
            epath.Path(self.path).unlink()

    # ------------------------------------------------------------- both
    def acquire(self) -> WorkdirLock:
        if paths.is_remote(self.path):
            self._acquire_remote()
        else:
            self._acquire_local()
        self.held = True
        return self

    def release(self) -> None:
        if not getattr(self, "held", False):
            return
        self.held = False
        try:
            if paths.is_remote(self.path):
                self._release_remote()
            else:
                self._release_local()
        except OSError as e:  # the lock dies with the process anyway
            log.warning("could not release the workdir lock %s: %s", self.path, e)


def acquire(workdir: str, user: str = "trainer", flag: str = "--workdir") -> WorkdirLock:
    """The lock of `workdir` (an existing directory), held; CheckpointError naming the holder
    if another `user` (a trainer; gpn-prepare on its `--output`) holds it."""
    return WorkdirLock(workdir, user, flag).acquire()
