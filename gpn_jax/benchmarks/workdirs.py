"""Benchmark working directories that no other local user can plant files in.

Without a `--workdir`, a benchmark gets a fresh private directory (`tempfile.mkdtemp`,
mode 0700), never a fixed name in a shared directory such as /tmp. A given directory is
created if missing and refused when it is a symbolic link or belongs to another user; files in
it are written by `open_new`, never through a link, FIFO or device in their place.
"""

import os
import tempfile

from gpn_jax.io.regular import open_fd_for_writing


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
    """Opens `path` for writing (emptied; `w+`: reading too), private to its owner (0600 for
    a new file). A symbolic link, hard link, FIFO, device or directory in its place is refused
    (`regular.open_fd_for_writing`, one line naming it) and left as it is."""
    fd = open_fd_for_writing(path, os.O_RDWR if "+" in mode else os.O_WRONLY, 0o600)
    os.ftruncate(fd, 0)
    return os.fdopen(fd, mode)
