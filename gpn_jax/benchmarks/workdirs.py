"""Benchmark working directories that no other local user can plant files in.

Without a `--workdir`, a benchmark gets a fresh private directory (`tempfile.mkdtemp`,
mode 0700), never a fixed name in a shared directory such as /tmp. A given directory is
created if missing and refused when it is a symbolic link or belongs to another user; files in
it are opened without following a symbolic link (`open_new`).
"""

import os
import tempfile


def prepare(workdir: str, prog: str) -> str:
    """The directory to work in: `workdir` checked (and created), or a new private one."""
    if not workdir:
        path = tempfile.mkdtemp(prefix=f"{prog}-")
        print(f"{prog}: working in {path}", flush=True)
        return path
    if os.path.islink(workdir):
        raise ValueError(
            f"--workdir={workdir} is a symbolic link; pass the directory it should be, or none "
            "for a new private one"
        )
    os.makedirs(workdir, mode=0o700, exist_ok=True)
    st = os.stat(workdir, follow_symlinks=False)
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise ValueError(
            f"--workdir={workdir} belongs to another user (uid {st.st_uid}); pass a directory "
            "you own, or none for a new private one"
        )
    return workdir


def open_new(path: str, mode: str = "w"):
    """Opens `path` for writing (truncated), refusing a symbolic link in its place."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    if "+" in mode:
        flags = (flags & ~os.O_WRONLY) | os.O_RDWR
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as e:
        if os.path.islink(path):
            raise ValueError(f"{path} is a symbolic link; remove it or use another workdir") from e
        raise
    return os.fdopen(fd, mode)
