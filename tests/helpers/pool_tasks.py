"""Tasks for `gpn_jax.parallel.core_pool`'s worker processes: they import tasks by module, so the
tasks live here rather than in the test module."""

import os
import time


def where(task: int) -> tuple[int, int, tuple[int, ...]]:
    """A task run in a worker: (its value squared, the process, the cores it may use)."""
    return task * task, os.getpid(), tuple(sorted(os.sched_getaffinity(0)))


def fail_on_three(task: int) -> int:
    if task == 3:
        raise ValueError("task 3 is bad")
    return task


def mark_worker() -> None:
    os.environ["CORE_POOL_TEST_SETUP"] = f"ran in {os.getpid()}"


def setup_mark(task: int) -> str | None:
    return os.environ.get("CORE_POOL_TEST_SETUP")


def pid_then_sleep(path: str) -> None:
    """Writes this worker's pid to `path`, then sleeps (a task still running when killed)."""
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)
