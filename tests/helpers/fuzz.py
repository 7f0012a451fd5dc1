"""What every fuzz test of a loader checks: only one-line errors, no file read outside the
directory under test, no allocation beyond the input's own size.

`Watch` records the files Python opens (an audit hook; installed once per process, active
only inside a `watch(...)` block) and the peak of Python-visible allocations (tracemalloc,
which numpy reports its buffers to). Native libraries that bypass Python (tensorstore's C++
reads) are not seen by either.
"""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
import tracemalloc

_ACTIVE: list[list[str]] = []
_INSTALLED = False
# Where the interpreter and libraries live: modules imported lazily are opened from here.
_LIBRARY_ROOTS = tuple(
    {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, *sysconfig.get_paths().values())}
) + ("/dev/", "/proc/", "/sys/")


def _hook(event: str, args) -> None:
    if event == "open" and _ACTIVE and isinstance(args[0], str | bytes | os.PathLike):
        _ACTIVE[-1].append(os.fsdecode(args[0]))


def _install() -> None:
    global _INSTALLED
    if not _INSTALLED:
        sys.addaudithook(_hook)
        _INSTALLED = True


class Watch:
    """Result of `watch`: the files opened and the peak allocation (bytes) inside it."""

    def __init__(self):
        self.opened: list[str] = []
        self.peak = 0

    def outside(self, root: str) -> list[str]:
        """Opened paths that are neither under `root` nor library code."""
        root = os.path.realpath(root)
        bad = []
        for p in self.opened:
            real = os.path.realpath(p)
            if real == root or real.startswith(root + os.sep):
                continue
            if real.startswith(_LIBRARY_ROOTS) or os.path.isdir(real):
                continue
            bad.append(p)
        return bad


@contextlib.contextmanager
def watch():
    """Records what the block opens and its peak Python-visible allocation."""
    _install()
    result = Watch()
    _ACTIVE.append(result.opened)
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        yield result
    finally:
        result.peak = tracemalloc.get_traced_memory()[1] - base
        if started:
            tracemalloc.stop()
        _ACTIVE.pop()


def one_line(e: BaseException, path_fragment: str) -> None:
    """Asserts `e` is one line naming `path_fragment`."""
    text = str(e)
    assert text.strip() and "\n" not in text, repr(text)
    assert path_fragment in text, (path_fragment, text)
