"""Opening only regular files, of bounded size: what a reader of untrusted directories needs.

A FIFO planted where a reader expects a file makes a plain `open` block forever (no writer),
and a symlink to `/dev/zero` makes a plain `read()` allocate without end. `open_regular` opens
with O_NONBLOCK (a FIFO opens at once) and checks the opened descriptor with `fstat` (no
race between a check and the open), so only regular files are ever read, and
`read_regular_file` never reads more than a bound the caller states.
"""

import os
import stat


class NotRegularFileError(OSError):
    """`path` is not a regular file (a FIFO, device, socket or directory), or is too large."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def open_regular(path, max_bytes: int | None = None):
    """(binary file object, size) of the regular file `path`; NotRegularFileError for anything
    else, or for a file of more than `max_bytes` bytes (checked on the open descriptor)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFileError(f"{os.fspath(path)} is {_kind(info.st_mode)}")
        if max_bytes is not None and info.st_size > max_bytes:
            raise NotRegularFileError(
                f"{os.fspath(path)} is {info.st_size} bytes, more than the {max_bytes} expected"
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), info.st_size
    except BaseException:
        os.close(fd)
        raise


def read_regular_file(path, max_bytes: int) -> bytes:
    """The bytes of the regular file `path`, at most `max_bytes` (NotRegularFileError otherwise,
    also when the file grows past the bound while being read)."""
    f, size = open_regular(path, max_bytes)
    with f:
        data = f.read(size + 1)  # its own size: `read(n)` allocates n bytes up front
    if len(data) > size:
        raise NotRegularFileError(f"{os.fspath(path)} grew while being read")
    return data
