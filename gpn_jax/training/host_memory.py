"""The C heap around XLA:CPU steps (glibc): free pages back to the OS once a step has compiled
(`release_free_heap`), and freed buffers kept for reuse between steps (`reuse_freed_heap`).

Why: compiling a step (XLA's passes, LLVM) grows the heap by a few hundred MB that is freed
afterwards but kept by glibc, while the step's buffers are large allocations mapped afresh,
so the process's resident memory counts both. Measured on the CPU bench's GPN+M step
(`bench_small`, B 16 x T 512): resident memory after compiling 620 -> 389 MB after the trim,
and the peak while running the step 1.12 -> 0.90 GiB. Nothing else in the stack does this
(jax and XLA leave the allocator alone), so the trainer and the bench call
`release_free_heap` once, after the step's first call compiled it (`steady_step_memory`).
A no-op returning False where the C library has no `malloc_trim` (macOS, musl).

Between steps the opposite holds: by default glibc maps every block above its mmap threshold
(128 KiB, rising to at most 32 MiB as mapped blocks are freed) afresh and unmaps it when
freed, so each step's large buffers page-fault in anew. `reuse_freed_heap` raises the mmap
and trim thresholds so freed buffers stay in the heap for the next step. Measured on the MQAR
sweep's Gated DeltaNet step (~236K parameters, 32 x 32 tokens, 2-core AVX-512, 2026-12-02):
minor page faults 4.25M -> 0.25M over 310 steps, 42 -> 27 ms a step on both cores and 64 ->
42 ms on one; GPN+M 22 -> 19 ms on one core, Transformer++ unchanged. The MQAR sweep's
single-core workers call it before training.

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
beside it, 4 of 64 calls of a test step did (`tests/training/test_host_memory.py`).

Measured with `python experiments/bench/step_memory.py --model=M` (the `bench_small` step, B 16 x
T 512, in two processes stepped in turn; 2-core AVX-512, 2026-12-03), default -> both:

    GPN+M          minor faults 112,772 -> 0 a step (medians), step time ratio 0.949 (12 rounds) and
                   1.004 (8 rounds) in two runs, peak RSS 0.93 / 0.89 -> 0.89 GiB
    Transformer++  683,142 -> 98,310 faults, system time 3.23 -> 0.18 s a step, ratio 0.619
                   (8 of 8 rounds faster), peak RSS 2.72 -> 2.69 GiB
    Gated DeltaNet 827,318 -> 0 faults, system time 4.70 -> 0.02 s, ratio 0.555 (8 of 8),
                   peak RSS 3.65 -> 3.64 GiB

How much a fault costs varies with the machine's state (the default runs' system time per step
ranged over 0.25-4.7 s that day). Either part alone changed nothing for GPN+M (reuse alone: the
same faults; inline alone: ratio 0.99), and reuse with the runtime thread allocating from the
main heap instead (`MALLOC_ARENA_MAX=1`) doubled its peak RSS (1.73 GiB): the next step
allocated before the last one had freed.
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
