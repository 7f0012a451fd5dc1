"""`gpn_jax.parallel.core_pool`: independent tasks in single-core worker processes."""

import os
import subprocess
import sys
import time

import pytest

from gpn_jax.parallel import core_pool
from tests.environment import SESSION_CORES
from tests.helpers.pool_tasks import fail_on_three, mark_worker, setup_mark, where


def TWO_CORES(test):  # noqa: N802 - reads as the marker it stands for
    """On every core of the test session (an xdist worker's own share may be one core);
    skipped on a machine with fewer than 2."""
    test = pytest.mark.usefixtures("all_cores")(test)
    return pytest.mark.skipif(len(SESSION_CORES) < 2, reason="needs 2 CPU cores")(test)


@TWO_CORES
def test_two_workers_each_run_pinned_to_their_own_core():
    out = dict(core_pool.map_unordered(where, range(6), workers=2))
    assert sorted(out) == list(range(6))
    assert [out[i][0] for i in range(6)] == [i * i for i in range(6)]
    workers = {pid: cpus for _, pid, cpus in out.values()}
    assert os.getpid() not in workers
    assert all(len(cpus) == 1 for cpus in workers.values())  # one core each
    assert len(set(workers.values())) == len(workers)  # never the same core twice
    assert len(workers) <= 2


def test_one_worker_runs_here_in_order():
    out = list(core_pool.map_unordered(where, [2, 3], workers=1))
    assert [(i, sq, pid) for i, (sq, pid, _) in out] == [(0, 4, os.getpid()), (1, 9, os.getpid())]


@TWO_CORES
def test_a_failing_task_raises_its_error_here():
    with pytest.raises(ValueError, match="task 3 is bad"):
        list(core_pool.map_unordered(fail_on_three, range(5), workers=2))


def test_auto_workers_is_one_per_core_on_cpu():
    assert core_pool.auto_workers(0) == len(core_pool.usable_cpus())  # the suite runs on CPU
    assert core_pool.auto_workers(3) == 3
    with pytest.raises(ValueError, match="workers must be >= 0"):
        core_pool.auto_workers(-1)


@TWO_CORES
def test_worker_setup_runs_in_every_worker_before_its_tasks():
    out = dict(core_pool.map_unordered(setup_mark, range(4), workers=2, worker_setup=mark_worker))
    assert all(mark and mark != f"ran in {os.getpid()}" for mark in out.values())
    assert "CORE_POOL_TEST_SETUP" not in os.environ  # workers only
    assert dict(core_pool.map_unordered(setup_mark, [0], workers=1, worker_setup=mark_worker)) == {
        0: None  # one worker is this process: its settings stay the caller's
    }


def _read(path: str) -> str:
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        return f.read()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


@TWO_CORES
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_die_with_a_killed_parent(tmp_path):
    """A sweep killed with SIGKILL (no cleanup runs) leaves no worker training on."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = [str(tmp_path / "a"), str(tmp_path / "b")]
    code = (
        "from gpn_jax.parallel import core_pool\n"
        "from tests.helpers import pool_tasks as t\n"
        f"list(core_pool.map_unordered(t.pid_then_sleep, {paths!r}, workers=2))\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=root)
    deadline = time.time() + 60
    while not all(_read(p) for p in paths):
        assert time.time() < deadline and parent.poll() is None, "workers never started"
        time.sleep(0.1)
    pids = [int(_read(p)) for p in paths]
    assert all(_alive(pid) for pid in pids)
    parent.kill()
    parent.wait()
    deadline = time.time() + 20
    while any(_alive(pid) for pid in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)
