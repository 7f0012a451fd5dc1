"""`training.host_memory.release_free_heap`: the heap's free pages go back to the OS."""

import ctypes
import os
import platform

import pytest

from gpn_jax.training import host_memory
from tests.environment import glibc_env


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


_TOUCH_TWICE = """
import ctypes, resource, sys
from gpn_jax.training import host_memory
if sys.argv[1] == "reuse":
    assert host_memory.reuse_freed_heap() is True
if sys.argv[1] == "reuse_all":  # every block, whatever its size (a step's temporaries)
    assert host_memory.reuse_freed_heap(None) is True
libc = host_memory._libc()
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 64 * 2**20  # a step-sized buffer: above glibc's 32 MiB ceiling for its mmap threshold
for _ in range(2):  # allocate, touch, free: the second round is the next step's buffer
    block = libc.malloc(size)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    ctypes.memset(block, 1, size)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    libc.free(block)
print(faults)
"""


@pytest.mark.skipif(
    platform.system() != "Linux" or host_memory._libc() is None, reason="needs glibc"
)
def test_a_freed_buffer_is_reused_without_page_faults():
    """By default a freed 64 MiB block is unmapped and the next one faults in all 16,384 of
    its pages again; after `reuse_freed_heap` the heap keeps it and the next touch is free
    (16,384 faults vs none). A fresh interpreter: mallopt settings are per process."""
    import subprocess
    import sys

    def second_touch_faults(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _TOUCH_TWICE, mode], check=True,
                             capture_output=True, text=True, env=glibc_env(os.environ))  # fmt: skip
        return int(out.stdout)

    assert second_touch_faults("default") > 8_000  # half its pages, at least
    assert second_touch_faults("reuse") < 1_000
    assert second_touch_faults("reuse_all") < 1_000


def test_without_mallopt_reuse_is_a_no_op(monkeypatch):
    monkeypatch.setattr(host_memory, "_libc", lambda: None)
    assert host_memory.reuse_freed_heap() is False


_STEPS = """
import resource, sys
from gpn_jax.training import host_memory
if sys.argv[1] == "inline":
    host_memory.inline_cpu_steps()  # before JAX starts
import jax, jax.numpy as jnp
def step(x):  # a scan's stacked outputs: a 128 MiB temporary, as a training step's residuals
    ys = jax.lax.scan(lambda c, _: (c * 1.0001 + 1.0, c), x, None, length=32)[1]
    return (ys * ys[::-1]).sum()
x = jnp.ones((2**20,))
f = jax.jit(step).lower(x).compile()
f(x).block_until_ready()
assert host_memory.cpu_steps_inline() is (sys.argv[1] == "inline")
assert host_memory.steady_step_memory() is host_memory.cpu_steps_inline()  # reuse: inline only
f(x).block_until_ready()  # grows the heap to the step's size
faults = []
for _ in range(9):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    f(x).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sorted(faults)[len(faults) // 2])  # the median call
"""


@pytest.mark.skipif(
    platform.system() != "Linux" or host_memory._libc() is None, reason="needs glibc"
)
def test_inline_steps_reuse_their_temporaries_without_page_faults():
    """A jitted step with a 128 MiB temporary, after `steady_step_memory`: dispatched as JAX
    does by default (where it keeps the heap as it was) its temporaries fault in afresh
    (allocated on a runtime thread, freed after the call returns: all 65,536 pages a call), run
    inline (`inline_cpu_steps`) they are the last call's (a handful of faults). Not every call:
    the runtime can still free a step's buffers a moment after the call returns, and the next
    call then maps its own (more often on a busy machine), so the median of 9 calls is
    compared."""
    import subprocess
    import sys

    def steady_faults(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _STEPS, mode], check=True,
                             capture_output=True, text=True, env=glibc_env(os.environ))  # fmt: skip
        return int(out.stdout.split()[-1])

    assert steady_faults("async") > 16_384  # half the temporary's pages, at least
    assert steady_faults("inline") < 1_000
