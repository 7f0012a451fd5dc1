"""Independent runs side by side on one host: one single-core worker process per CPU core.

Small models (the MQAR grid's ~236K-parameter runs, 1,024 tokens a step) use a second core
poorly, so runs pinned one per core train more steps per second than the same runs one after
another on every core (docs/results.md, the MQAR sweep). `map_unordered` runs a function over tasks in `workers` spawned
processes, each pinned to its own core before JAX starts a backend in it, and yields the
results as they finish. `workers == 1` runs the tasks in this process, one after the other.

Why not `jax.vmap` over runs: XLA:CPU runs the batched matmuls of a vmapped grid no faster per
run than one run's step, and separate processes keep each run's program the one a single run
compiles.

The function and tasks are pickled to the workers (spawn, never fork: JAX's threads do not
survive a fork), so the function must be importable at module level. An exception in a
task is raised here, with its message, and the tasks not yet started are cancelled.
"""

import concurrent.futures as futures
import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

_PR_SET_PDEATHSIG = 1  # <sys/prctl.h>


def usable_cpus() -> list[int]:
    """The CPU cores this process may run on (its affinity mask, where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def auto_workers(requested: int) -> int:
    """`requested` when >= 1; for 0, one worker per usable core on the CPU backend and 1 on
    an accelerator (where runs share the device, not the cores)."""
    if requested < 0:
        raise ValueError(f"workers must be >= 0 (0: one per CPU core), got {requested}")
    if requested:
        return requested
    import jax

    return len(usable_cpus()) if jax.default_backend() == "cpu" else 1


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel sends this worker SIGTERM when the process that started it dies (a
    killed sweep must not leave runs training on). Elsewhere the pool's own shutdown holds."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _start_worker(parent: int, cores, setup: Callable[[], None] | None) -> None:
    """Worker initializer: die with the parent, take one core off the shared queue and run on
    it alone, then run the caller's `setup` (e.g. JAX settings, before anything compiles)."""
    if sys.platform.startswith("linux"):
        _die_with_parent(parent)
    core = cores.get()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    if setup is not None:
        setup()


def map_unordered(
    fn: Callable[[Any], Any],
    tasks: Iterable[Any],
    workers: int,
    worker_setup: Callable[[], None] | None = None,
) -> Iterator[tuple[int, Any]]:
    """(index into `tasks`, fn(task)) for every task, in the order they finish.
    `worker_setup()` runs once in each worker process before its first task (not when
    `workers == 1`: this process's settings are the caller's)."""
    tasks = list(tasks)
    if workers <= 1 or len(tasks) <= 1:
        for i, task in enumerate(tasks):
            yield i, fn(task)
        return
    ctx = multiprocessing.get_context("spawn")
    cpus, cores = usable_cpus(), ctx.Queue()
    n = min(workers, len(tasks))
    for w in range(n):
        cores.put(cpus[w % len(cpus)])
    pool = futures.ProcessPoolExecutor(
        n, mp_context=ctx, initializer=_start_worker, initargs=(os.getpid(), cores, worker_setup)
    )
    try:
        pending = {pool.submit(fn, task): i for i, task in enumerate(tasks)}
        for done in futures.as_completed(pending):
            yield pending[done], done.result()
    finally:  # an error, or the caller stopped iterating: drop what has not started
        pool.shutdown(wait=True, cancel_futures=True)
        cores.close()
