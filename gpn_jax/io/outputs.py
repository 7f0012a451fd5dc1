"""`--out` / `--output` checked before any work: a command that would fail to write its result
after minutes of work fails at once instead, in one line naming the flag.

A file output must not be an existing directory and its parent must be (or become) a
directory; a directory output must not be an existing file, nor lie under one. Object-store
URLs are not checked here (they have no directories to collide with).
"""

import os

from gpn_jax.io import paths
from gpn_jax.io.regular import kind


def _blocking_ancestor(path: str) -> str | None:
    """The nearest existing ancestor of `path` that is not a directory, if any."""
    parent = os.path.dirname(path)
    while parent and not os.path.exists(parent):
        up = os.path.dirname(parent)
        if up == parent:
            return None
        parent = up
    return parent if parent and not os.path.isdir(parent) else None


def check_out_file(path: str | None, flag: str = "--out") -> None:
    """Raises a one-line ValueError unless `path` can be written as a file."""
    if not path or paths.is_remote(path):
        return
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(full):
        raise ValueError(
            f"{flag}={path} is a directory; give a file path, e.g. {flag}={path}/results.json"
        )
    if os.path.exists(full) and not os.path.isfile(full):  # a FIFO, device or socket
        what = kind(os.stat(full).st_mode)
        raise ValueError(f"{flag}={path} is {what}, not a regular file; give a file path")
    if blocker := _blocking_ancestor(full):
        raise ValueError(
            f"{flag}={path}: {blocker} is a file, not a directory; choose another {flag}"
        )
    parent = os.path.dirname(full)
    if os.path.isdir(parent) and not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(
            f"{flag}={path}: directory {parent} is not writable; choose another {flag}"
        )


def check_out_dir(path: str | None, flag: str = "--out") -> None:
    """Raises a one-line ValueError unless `path` is, or can be created as, a directory."""
    if not path or paths.is_remote(path):
        return
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(full) and not os.path.isdir(full):
        raise ValueError(f"{flag}={path} is a file, not a directory; give a directory {flag}")
    if blocker := _blocking_ancestor(full):
        raise ValueError(
            f"{flag}={path}: {blocker} is a file, not a directory; choose another {flag}"
        )
    if os.path.isdir(full) and not os.access(full, os.W_OK | os.X_OK):
        raise ValueError(f"{flag}={path}: the directory is not writable; choose another {flag}")


def check_outside(path: str | None, workdir: str, flag: str = "--out") -> None:
    """Raises a one-line ValueError if `path` is the run's `workdir` or lies inside it (a reader
    of a run never writes into it)."""
    if not path or paths.is_remote(path) or paths.is_remote(workdir):
        return
    full = os.path.realpath(os.path.expanduser(path))
    root = os.path.realpath(workdir)
    if full == root or full.startswith(root + os.sep):
        raise ValueError(f"{flag}={path} is inside the run's workdir {workdir}; write elsewhere")
