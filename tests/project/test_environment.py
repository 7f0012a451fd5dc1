"""tests/environment.py and tests/conftest.py: how the suite shares the machine's cores, and
which allocator its processes use."""

import os
import shutil
import subprocess
import sys

import pytest

from tests import environment
from tests.environment import SESSION_CORES, this_worker_cores, worker_cores


@pytest.mark.parametrize(
    "worker, workers, cores, want",
    [
        ("gw0", 2, [0, 1], {0}),
        ("gw1", 2, [0, 1], {1}),
        ("gw2", 3, [4, 5], {4}),  # more workers than cores: they share, one core each
        ("gw1", 2, [0, 1, 2, 3, 4], {1, 3}),  # more cores: every 2nd from the index
        ("gw0", 2, [7, 3, 5], {3, 7}),  # in core order, whatever order they came in
        (None, 0, [0, 1], None),  # not an xdist worker
        ("gw0", 1, [0, 1], None),  # one worker: every core
        ("gw1", 2, [0], None),  # one core: nothing to split
    ],
)
def test_worker_cores(worker, workers, cores, want):
    assert worker_cores(worker, workers, cores) == want


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity here")
def test_this_worker_runs_on_its_share_and_all_cores_widens_it(request):
    assert os.sched_getaffinity(0) == (this_worker_cores() or SESSION_CORES)
    assert request.getfixturevalue("all_cores") == SESSION_CORES
    assert os.sched_getaffinity(0) == SESSION_CORES


def test_malloc_env_preloads_the_library_first_once_and_glibc_env_removes_only_it(monkeypatch):
    monkeypatch.setattr(environment, "mimalloc_library", lambda: "/lib/libmimalloc.so.3")
    env = environment.malloc_env({"LD_PRELOAD": "/lib/other.so", "PATH": "/bin"})
    assert env["LD_PRELOAD"] == "/lib/libmimalloc.so.3 /lib/other.so"
    assert env["MIMALLOC_ALLOW_THP"] == "0" and env["PATH"] == "/bin"
    assert environment.malloc_env(env) == env  # already preloaded: unchanged
    assert environment.glibc_env(env)["LD_PRELOAD"] == "/lib/other.so"
    assert "LD_PRELOAD" not in environment.glibc_env(environment.malloc_env({}))


def test_without_the_library_both_leave_the_environment_as_it_is(monkeypatch):
    monkeypatch.setattr(environment, "mimalloc_library", lambda: None)
    env = {"LD_PRELOAD": "/lib/other.so", "PATH": "/bin"}
    assert environment.malloc_env(env) == env == environment.glibc_env(env)


def test_system_malloc_variable_turns_the_preload_off(monkeypatch):
    monkeypatch.setenv("GPN_TESTS_SYSTEM_MALLOC", "1")
    assert environment.mimalloc_library() is None


def _mapped_files(maps: str) -> set:
    return {os.path.realpath(line.split()[-1]) for line in maps.splitlines() if "/" in line}


def _child_maps(env) -> str:
    return subprocess.run(
        [sys.executable, "-c", "print(open('/proc/self/maps').read())"], env=env,
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


@pytest.mark.skipif(
    environment.mimalloc_library() is None, reason="no mimalloc here (dev extra, Linux)"
)
def test_test_processes_and_their_children_allocate_through_mimalloc_glibc_env_ones_do_not():
    """An xdist worker (started after conftest.py set the preload) and every process a test
    starts map the library; a process started with `glibc_env` does not."""
    lib = os.path.realpath(environment.mimalloc_library())
    if os.environ.get("PYTEST_XDIST_WORKER"):
        assert lib in _mapped_files(open("/proc/self/maps").read())
    assert lib in _mapped_files(_child_maps(os.environ))
    assert lib not in _mapped_files(_child_maps(environment.glibc_env(os.environ)))


def test_python3_on_the_tests_path_is_this_interpreter():
    """Issue 84: from a venv's python that was never activated, PATH's first `python3` was the
    system's (no JAX), and the launch scripts and the rehearsal the tests start failed."""
    env = environment.interpreter_first({"PATH": f"/usr/bin{os.pathsep}/bin"})
    for path in (env["PATH"], os.environ["PATH"]):  # the helper, and what conftest set
        found = shutil.which("python3", path=path) or shutil.which("python", path=path)
        assert os.path.realpath(found) == os.path.realpath(sys.executable), path
    assert env["PATH"].split(os.pathsep)[1:] == ["/usr/bin", "/bin"]
