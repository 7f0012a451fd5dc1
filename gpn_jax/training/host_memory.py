"""The C heap around XLA:CPU steps (glibc): free pages back to the OS once a step has compiled
(`release_free_heap`), and freed buffers kept for reuse between steps (`reuse_freed_heap`).

Why: compiling a step (XLA's passes, LLVM) grows the heap by a few hundred MB that is freed
afterwards but kept by glibc, while the step's buffers are large allocations mapped afresh,
so the process's resident memory counts both. Measured on the CPU bench's GPN+M step
(`bench_small`, B 16 x T 512): resident memory after compiling 620 -> 389 MB after the trim,
and the peak while running the step 1.12 -> 0.90 GiB. Nothing else in the stack does this
(jax and XLA leave the allocator alone), so the trainer and the bench call
`release_free_heap` once, after the step's first call compiled it. A no-op returning False
where the C library has no `malloc_trim` (macOS, musl).

Between steps the opposite holds: by default glibc maps every block above its mmap threshold
(128 KiB, rising to at most 32 MiB as mapped blocks are freed) afresh and unmaps it when
freed, so each step's large buffers page-fault in anew. `reuse_freed_heap` raises the mmap
and trim thresholds so freed buffers stay in the heap for the next step. Measured on the MQAR
sweep's Gated DeltaNet step (~236K parameters, 32 x 32 tokens, 2-core AVX-512, 2026-12-02):
minor page faults 4.25M -> 0.25M over 310 steps, 42 -> 27 ms a step on both cores and 64 ->
42 ms on one; GPN+M 22 -> 19 ms on one core, Transformer++ unchanged. The MQAR sweep's
single-core workers call it before training.
"""

import ctypes
import functools

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, <malloc.h>


@functools.cache
def _libc():
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def release_free_heap() -> bool:
    """Returns the heap's free pages to the OS; True where the C library could (glibc)."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def reuse_freed_heap(limit: int = 1 << 30) -> bool:
    """Blocks up to `limit` bytes come from the heap and, freed, stay there for reuse (up to
    `limit` bytes of free heap top are kept); True where the C library could (glibc)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    limit = ctypes.c_int(min(limit, 2**31 - 1))
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, limit) and libc.mallopt(_M_TRIM_THRESHOLD, limit))
