"""Opening only regular files: bounded reads of untrusted files, and writes into a run or output
folder that never reach another file.

A FIFO planted where a reader expects a file makes a plain `open` block forever (no writer),
and a symlink to `/dev/zero` makes a plain `read()` allocate without end. `open_regular` opens
with O_NONBLOCK (a FIFO opens at once) and checks the opened descriptor with `fstat` (no
race between a check and the open), so only regular files are ever read, and
`read_regular_file` never reads more than a bound the caller states.

Writing into a folder a user may have prepared (a workdir, an `--output`), a symlink planted
at a file's name would send the run's bytes elsewhere (`metrics.jsonl -> ~/notes.txt`), a
hard link would make a truncation hit the other name's file (`cp -al` snapshots make them),
and a FIFO or device would hang or fail naming no file. `open_fd_for_writing` and
`open_for_writing` refuse all four on the opened descriptor, before anything is written.
"""

import contextlib
import errno
import gzip
import io
import os
import stat


class NotRegularFileError(OSError):
    """`path` is not a regular file (a FIFO, device, socket or directory), or is too large, or
    (writing) is a symlink or has other hard links."""


_WRITE_FIX = "remove it (gpn_jax writes only its own regular files into a run or output folder)"


def kind(mode: int) -> str:
    """What a non-regular file of `mode` is, in words."""
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
            raise NotRegularFileError(f"{os.fspath(path)} is {kind(info.st_mode)}")
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


def read_gzip(path, max_bytes: int) -> bytes:
    """The decompressed bytes of the regular gzip file `path`, at most `max_bytes`
    (NotRegularFileError otherwise: a small file may expand without end), read in blocks."""
    raw, _ = open_regular(path)
    blocks, total = [], 0
    with raw, gzip.GzipFile(fileobj=raw, mode="rb") as f:
        while block := f.read(1 << 20):
            total += len(block)
            if total > max_bytes:
                raise NotRegularFileError(
                    f"{os.fspath(path)} holds more than the {max_bytes} bytes expected, "
                    "decompressed"
                )
            blocks.append(block)
    return b"".join(blocks)


def _refuse_write(path, what: str) -> NotRegularFileError:
    return NotRegularFileError(f"{os.fspath(path)}: {what}; {_WRITE_FIX}")


def open_fd_for_writing(path, flags: int = os.O_WRONLY, mode: int = 0o666) -> int:
    """A descriptor of the regular file `path` (created if absent; `mode` before the umask)
    opened with `flags` (never O_TRUNC: truncate the returned descriptor, once it is known to
    be this file alone). NotRegularFileError for a symlink, a FIFO, device, socket or
    directory, or a file with more than one hard link; nothing is written to any of them."""
    flags |= os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags & ~os.O_TRUNC, mode)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise
        info = os.lstat(path)  # ENXIO: a FIFO without a reader; ELOOP: the final name a link
        what = "a symbolic link" if stat.S_ISLNK(info.st_mode) else kind(info.st_mode)
        raise _refuse_write(path, f"is {what}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refuse_write(path, f"is {kind(info.st_mode)}")
        if info.st_nlink > 1:
            raise _refuse_write(path, f"has {info.st_nlink - 1} other hard link(s)")
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


@contextlib.contextmanager
def naming(path):
    """Re-raises an OS error of the block that names no file as one naming `path`: a failed
    write (EFBIG past `ulimit -f`, ENOSPC) names none, and its one line must say which file."""
    try:
        yield
    except OSError as e:
        if e.errno is None or e.filename is not None:
            raise
        raise OSError(e.errno, e.strerror, os.fspath(path)) from None


class _NamedWriter(io.BufferedWriter):
    """A buffered writer whose OS errors (a write's, or the flush at close) name its file."""

    def __init__(self, raw, path):
        super().__init__(raw)
        self._path = os.fspath(path)

    def write(self, data):
        with naming(self._path):
            return super().write(data)

    def flush(self):
        with naming(self._path):
            super().flush()

    def close(self):
        with naming(self._path):
            super().close()


def open_for_writing(path, *, append: bool = False, text: bool = False):
    """A file object writing the regular file `path` alone (`open_fd_for_writing`): appended to
    (`append`), else emptied first; its OS errors name `path`. `text`: line-buffered UTF-8."""
    fd = open_fd_for_writing(path, os.O_WRONLY | (os.O_APPEND if append else 0))
    if not append:
        os.ftruncate(fd, 0)
    f = _NamedWriter(io.FileIO(fd, "a" if append else "w"), path)
    return io.TextIOWrapper(f, encoding="utf-8", line_buffering=True) if text else f


# Per kind of input: one document (a .txt file, a jsonl line) and a text read whole (a stream
# to score). Tokenizing a document holds a few times its size; more is not a document.
MAX_DOCUMENT_BYTES = 32 << 20
MAX_TEXT_BYTES = 256 << 20


def read_text(path, max_bytes: int = MAX_DOCUMENT_BYTES) -> str:
    """The UTF-8 text of the regular file `path`, at most `max_bytes` (NotRegularFileError
    otherwise; UnicodeDecodeError for bytes that are not UTF-8)."""
    return read_regular_file(path, max_bytes).decode("utf-8")


def bounded_lines(f, path, max_bytes: int = MAX_DOCUMENT_BYTES):
    """The lines of the binary file `f` (read from `path`), each at most `max_bytes`: a longer
    one is a one-line ValueError naming the line, read no further than the bound."""
    number = 0
    while line := f.readline(max_bytes + 1):
        number += 1
        if len(line) > max_bytes:
            raise ValueError(
                f"{os.fspath(path)}: line {number} is more than {max_bytes} bytes; split it "
                "into smaller documents"
            )
        yield line
