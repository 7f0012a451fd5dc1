"""The XLA environment of the tests and of every process they start.

Tests check behaviour (equivalences, exact values, errors), not speed, and most of a cold run
of the suite is XLA compiling many small programs, so test processes compile at LLVM's
cheapest optimisation level and without XLA:CPU's fusion emitters (programs compared across
processes, a CLI run against an in-process run, are then built the same way): a tiny train
step compiles several times faster that way. The price is slower code (several times fewer
tokens/s), so the few tests that mostly run (not compile) start their processes with XLA's
defaults (`fast=False`). The two xdist workers already keep both cores busy, so test processes
also run Eigen's matmuls on one thread and give LLVM one code-generation split (no thread
contention between the workers).

For the same reason each xdist worker runs on its own share of the cores (`worker_cores`, set
by `tests/conftest.py` before JAX starts), and so does every process it starts: XLA:CPU sizes
its runtime thread pools by the cores a process may use, and on 2 cores a worker's pools would
otherwise spin on the core the other worker needs. Tests of code that spreads work over cores
take the `all_cores` fixture (`SESSION_CORES`).
"""

import importlib.metadata
import os
import sys

from gpn_jax.parallel.core_pool import usable_cpus  # imports no JAX

# The cores the test session may use, read before a worker is pinned to its share.
SESSION_CORES = frozenset(usable_cpus())


def worker_cores(worker: str | None, workers: int, cores) -> set | None:
    """The cores of xdist worker `worker` ('gw<i>') of `workers`: every `workers`-th core from
    its index (one core each when the workers are at least as many as the cores). None where
    there is nothing to split: not an xdist worker, or one worker."""
    cores = sorted(cores)
    if not worker or workers < 2 or len(cores) < 2:
        return None
    index = int(worker.removeprefix("gw"))
    if workers >= len(cores):
        return {cores[index % len(cores)]}
    return set(cores[index % workers :: workers])


def this_worker_cores() -> set | None:
    """`worker_cores` of this process, from the variables pytest-xdist sets in its workers."""
    return worker_cores(
        os.environ.get("PYTEST_XDIST_WORKER"),
        int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")),
        SESSION_CORES,
    )


def _jaxlib_before(version: tuple[int, int]) -> bool:
    """Whether the installed jaxlib is older than `version` (read from its metadata, without
    importing JAX, which must not start before the flags are set)."""
    try:
        installed = importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        return False
    return tuple(int(p) for p in installed.split(".")[:2]) < version


# jaxlib 0.11's XLA:CPU has no switch for its fusion emitters (always on) and stops a process
# whose XLA_FLAGS name it, so the switch is set only where it exists.
FUSION_SWITCH = _jaxlib_before((0, 11))


def interpreter_first(env) -> dict:
    """`env` with the directory of the interpreter running the tests first on PATH: a script a
    test starts that calls `python3` or `python` by name (the launch scripts, the rehearsal)
    runs this interpreter and its packages, in a venv that was never activated as in one that
    was (there PATH's first `python3` may be a bare system one)."""
    env = dict(env)
    bin_dir = os.path.dirname(sys.executable)
    rest = [d for d in env.get("PATH", "").split(os.pathsep) if d and d != bin_dir]
    return env | {"PATH": os.pathsep.join([bin_dir, *rest])}


FAST_COMPILE = (
    "--xla_backend_optimization_level=0"
    + " --xla_cpu_use_fusion_emitters=false" * FUSION_SWITCH
    + " --xla_cpu_multi_thread_eigen=false --xla_cpu_parallel_codegen_split_count=1"
)
# GPN_TESTS_XLA_DEFAULTS=1 runs every test with XLA's default flags (to compare the two).
if os.environ.get("GPN_TESTS_XLA_DEFAULTS") == "1":
    FAST_COMPILE = ""

# Per-compile options (`.lower(...).compile(PRODUCTION_HLO)`) for the tests that read the
# optimised HLO (collectives per loop body): the fusion emitters change the HLO pipeline (the
# loop structure it leaves), so those programs are built as a user's would be.
PRODUCTION_HLO = {"xla_cpu_use_fusion_emitters": True} if FUSION_SWITCH else None


def xla_flags(devices: int | None = None, fast: bool = True) -> str:
    """XLA_FLAGS for a test process: the fast compile flags (unless `fast=False`: XLA's
    defaults), and `devices` forced CPU devices."""
    forced = [f"--xla_force_host_platform_device_count={devices}"] if devices else []
    return " ".join([FAST_COMPILE] * fast + forced)


def one_device_env(fast: bool = True, **extra: str) -> dict:
    """A user's shell on one CPU device (not the tests' 8 forced devices), compiled with the
    tests' flags (`fast=False`: XLA's defaults, as a user's)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    flags = {"XLA_FLAGS": xla_flags(fast=fast), "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
    return env | flags | extra


# Test processes allocate through mimalloc (the `cmeel-mimalloc` wheel of the dev extra), not
# glibc's malloc: XLA's compiler makes millions of small allocations, and glibc's bin searches
# (`_int_malloc`, `unlink_chunk`, `malloc_consolidate`) took a fifth of the CPU time of the
# sharding tests' compiles. Only the allocator of the test processes changes; the tests of
# glibc's heap (`tests/training/test_host_memory.py`) start their processes with `glibc_env`.
# Transparent huge pages stay off (each 2 MiB page zeroed on first touch cost more system time
# than the allocator saved). GPN_TESTS_SYSTEM_MALLOC=1 runs every test on the system's malloc.
MIMALLOC_OPTIONS = {"MIMALLOC_ALLOW_THP": "0"}


def mimalloc_library() -> str | None:
    """The installed libmimalloc shared library; None where there is none, or off Linux (the
    preload is an ELF dynamic loader feature)."""
    if not sys.platform.startswith("linux") or os.environ.get("GPN_TESTS_SYSTEM_MALLOC") == "1":
        return None
    try:
        files = importlib.metadata.files("cmeel-mimalloc") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    libs = sorted(str(f.locate()) for f in files if f.name.startswith("libmimalloc.so"))
    return next((lib for lib in libs if os.path.isfile(lib)), None)


def malloc_env(env) -> dict:
    """`env` with mimalloc preloaded (`mimalloc_library`), for a test process and every process
    it starts; `env` unchanged where there is no library."""
    lib, env = mimalloc_library(), dict(env)
    preload = env.get("LD_PRELOAD", "").split()
    if lib is None or lib in preload:
        return env
    return env | MIMALLOC_OPTIONS | {"LD_PRELOAD": " ".join([lib, *preload])}


def glibc_env(env) -> dict:
    """`env` without the mimalloc preload: a process that allocates through glibc's malloc."""
    lib, env = mimalloc_library(), dict(env)
    preload = [p for p in env.pop("LD_PRELOAD", "").split() if p != lib]
    return env | ({"LD_PRELOAD": " ".join(preload)} if preload else {})
