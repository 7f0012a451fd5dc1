"""The C heap around XLA:CPU steps (glibc): free pages back to the OS once a step has compiled
(`release_free_heap`), and freed buffers kept for reuse between steps (`reuse_freed_heap`).

Why: compiling a step (XLA's passes, LLVM) grows the heap by a few hundred MB that is freed
afterwards but kept by glibc, while the step's buffers are large allocations mapped afresh,
so the process's resident memory counts both. Nothing else in the stack does this (jax and
XLA leave the allocator alone), so the trainer and the bench call `release_free_heap` once,
after the step's first call compiled it (`steady_step_memory`).
A no-op returning False where the C library has no `malloc_trim` (macOS, musl).

Between steps the opposite holds: by default glibc maps every block above its mmap threshold
(128 KiB, rising to at most 32 MiB as mapped blocks are freed) afresh and unmaps it when
freed, so each step's large buffers page-fault in anew. `reuse_freed_heap` raises the mmap
and trim thresholds so freed buffers stay in the heap for the next step (fewer page faults and
faster small steps; the MQAR sweep's single-core workers call it before training).

A large step's buffers need one more thing: by default JAX runs a CPU computation on a runtime
thread, which allocates the step's temporaries in its own arena (whose heaps cannot hold a
block over 64 MiB, so those are mapped afresh whatever the thresholds) and frees them a few
milliseconds after the outputs are ready, so the next step, dispatched at once, cannot reuse
them. `inline_cpu_steps` (before JAX starts its CPU client) runs single-device computations on
the calling thread instead, which allocates from the main heap and frees everything before the
call returns; `steady_step_memory` then keeps every freed block in the heap, whatever its size
(`reuse_freed_heap(None)`: Transformer++'s and Gated DeltaNet's steps hold 2.2 and 3.1 GiB of
temporaries, above what glibc's thresholds can express). The trainer
(`train.reuse_step_memory`, default on) and the bench's training records do both. Most steps,
not all: the runtime can still free a step's buffers a moment after the call returns (when its
last task ended on a pool thread), and the next step then maps its own; with a busy process
beside it, a few calls of a test step do (`tests/training/test_host_memory.py`).

What each part saves, per model, is measured by `experiments/bench/step_memory.py`; the numbers
are in docs/performance.md ("Steps' memory on CPU"). Either part alone changed nothing for GPN+M,
and reuse with the runtime thread allocating from the main heap instead (`MALLOC_ARENA_MAX=1`)
doubled its peak memory: the next step allocated before the last one had freed.
"""

import ctypes
import functools

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4  # mallopt parameters, <malloc.h>


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


def reuse_freed_heap(limit: int | None = 1 << 30) -> bool:
    """Blocks up to `limit` bytes come from the heap and, freed, stay there for reuse (up to
    `limit` bytes of free heap top are kept); None: every block, and the heap never shrinks
    but through `release_free_heap` (glibc takes these limits as C ints: 2 GiB at most, less
    than a large step's temporaries). True where the C library could (glibc)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    if limit is None:  # no block mapped apart; trimming off (-1, as mallopt(3) documents)
        return bool(libc.mallopt(_M_MMAP_MAX, 0) and libc.mallopt(_M_TRIM_THRESHOLD, -1))
    limit = ctypes.c_int(min(limit, 2**31 - 1))
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, limit) and libc.mallopt(_M_TRIM_THRESHOLD, limit))


def inline_cpu_steps() -> None:
    """Runs single-device CPU computations on the calling thread (JAX's
    `jax_cpu_enable_async_dispatch` off; multi-device ones stay asynchronous). Read when JAX
    starts its CPU client: call it before the process's first JAX computation, else it changes
    nothing. The GIL is released while a computation runs, so other Python threads (input
    pipeline, checkpoint writers) go on."""
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", False)


def cpu_steps_inline() -> bool:
    """Whether `inline_cpu_steps` is in effect (as set; the CPU client reads it when it starts)."""
    import jax

    return not jax.config.read("jax_cpu_enable_async_dispatch")


def steady_step_memory(reuse: bool = True) -> bool:
    """After a step has compiled: the compiler's freed heap goes back to the OS and, with
    `reuse` on the CPU backend with steps inline (`inline_cpu_steps`), the steps' freed buffers
    stay in the heap for the next step; True where reuse was set up. Not without inline steps:
    the runtime thread would then allocate the next step's buffers before freeing the last
    one's, and the kept heap doubles the peak RSS (the module doc)."""
    import jax

    released = release_free_heap()
    on_cpu = jax.default_backend() == "cpu"
    return reuse and released and on_cpu and cpu_steps_inline() and reuse_freed_heap(None)
