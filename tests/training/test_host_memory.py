"""`training.host_memory.release_free_heap`: the heap's free pages go back to the OS."""

import ctypes
import platform

import pytest

from gpn_jax.training import host_memory


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


@pytest.mark.skipif(
    platform.system() != "Linux" or host_memory._libc() is None, reason="needs glibc"
)
def test_freed_heap_pages_leave_the_resident_set():
    libc = host_memory._libc()
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    n, size = 20_000, 4096  # 80 MiB of small blocks: heap, not mmap
    blocks = [libc.malloc(size) for _ in range(n)]
    for b in blocks:
        ctypes.memset(b, 1, size)  # touched: resident
    pin = libc.malloc(64)  # above them on the heap, so freeing them cannot shrink its top
    for b in blocks:
        libc.free(b)
    before = _rss_bytes()
    assert host_memory.release_free_heap() is True
    dropped = before - _rss_bytes()
    libc.free(pin)
    assert dropped > 40 * 2**20, f"resident set fell by {dropped / 2**20:.1f} MiB only"


def test_without_malloc_trim_it_is_a_no_op(monkeypatch):
    monkeypatch.setattr(host_memory, "_libc", lambda: None)
    assert host_memory.release_free_heap() is False
