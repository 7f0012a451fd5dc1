"""Test setup: 8 forced CPU host devices (for sharding tests) before JAX starts."""

import atexit
import gc
import os
import sys
import tempfile

import pytest

from tests.environment import (
    SESSION_CORES,
    interpreter_first,
    malloc_env,
    this_worker_cores,
    xla_flags,
)

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + xla_flags(devices=8)).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Read at process start: the xdist workers (started after this file is imported) and every
# process they start allocate through mimalloc (tests/environment.py says why).
os.environ.update(malloc_env(os.environ))
# Scripts the tests start call `python3` by name: this interpreter, activated venv or not.
os.environ.update(interpreter_first(os.environ))

# Each xdist worker (and every process it starts) on its own share of the cores, before JAX
# sizes its CPU thread pool (tests/environment.py says why).
_OWN_CORES = this_worker_cores()
if _OWN_CORES and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, _OWN_CORES)

# Many tests (and the CLI subprocesses they start) compile the same tiny train steps: share
# compiled executables through JAX's persistent cache for the duration of the machine. Every
# compile is cached, not only slow ones: the processes the tests start each compile the same
# small programs (initialisation, evaluation, data steps) of the same tiny models, and reading
# one back costs less than compiling it again (a full run takes 2-5% less CPU time).
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "gpn_jax_test_xla_cache")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def pytest_collection_modifyitems(config, items):
    """Tests that start processes marked `process` (`tests/helpers/tiers.py`); slow end-to-end
    tests first (stable order otherwise): with `-n 2 --dist worksteal` a minute-long test that
    starts last leaves the other worker idle until it ends."""
    from tests.helpers import tiers

    for item in items:
        fn = getattr(item, "function", None)
        if fn is not None and tiers.starts_processes(fn, item.module, item.fixturenames):
            item.add_marker(pytest.mark.process)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_configure(config):
    """One garbage collection at session end instead of pytest's five (its unraisable-exception
    plugin collects repeatedly to surface late `__del__` errors): with JAX's caches full after
    hundreds of tests each pass takes seconds, which a profile of the suite shows as a visible
    share of the two workers' time. Unraisable exceptions are still reported."""
    try:
        from _pytest.unraisableexception import gc_collect_iterations_key
    except ImportError:  # a pytest without the key: keep its default
        return
    config.stash[gc_collect_iterations_key] = 1


def pytest_sessionstart(session):
    """The cyclic garbage collector runs every 10,000 net allocations instead of every 700:
    tracing and lowering JAX programs allocate millions of short-lived objects, and with JAX's
    caches and every imported module on the heap, the frequent collections took several percent
    of the in-process tests' CPU. Garbage is still collected, only in fewer passes."""
    gc.set_threshold(10_000, 10, 10)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """An xdist worker leaves as soon as its session is over. It has already sent the
    controller every result (the `workerfinished` event precedes this hook), and the run's
    time includes waiting for the workers to exit: JAX's exit handler tears down each of the
    thousands of executables a worker compiled, and the interpreter then waits on library
    threads, about 5 s of a full run's wall time that tests nothing. So the worker drops
    JAX's handler, runs every other one (the temporary directories that tests and the
    library remove at exit), and exits without the interpreter's shutdown. A run without
    xdist exits normally."""
    if not hasattr(config, "workerinput"):
        return
    jax_api = sys.modules.get("jax._src.api")  # JAX is not imported just to leave
    if getattr(jax_api, "clean_up", None) is not None:
        atexit.unregister(jax_api.clean_up)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def pytest_collection_finish(session):
    """Everything imported by collection (JAX, TensorFlow's data stack, every test module) lives
    for the whole session: frozen, later full collections no longer walk it (as the CLIs do
    once their stack is imported)."""
    from gpn_jax.io import cli

    cli.settle_heap()


@pytest.fixture(scope="session", autouse=True)
def _train_each_tokenizer_once():
    """The data pipeline trains a tokenizer for every new workdir; dozens of in-process tests
    train the same one (the embedded corpus at the tiny configs' vocabulary), about a CPU
    second each. Training is deterministic (`test_training_is_deterministic_and_model_reloads`),
    so within a test process the pipeline's training runs once per (text, vocabulary, options)
    and later workdirs get the same model, saved to their own path. `train_tokenizer` itself,
    and every process the tests start, still trains."""
    from gpn_jax.data import pipeline
    from gpn_jax.data.tokenizer import Tokenizer

    real, trained = pipeline.train_tokenizer, {}

    def once(docs, vocab_size, model_path=None, **options):
        docs = tuple(docs)  # the key itself: compared whole, no digest to collide
        key = (docs, vocab_size, tuple(sorted(options.items())))
        if key not in trained:
            trained[key] = real(docs, vocab_size, **options).model_proto
        tokenizer = Tokenizer(trained[key])
        if model_path:
            tokenizer.save(model_path)
        return tokenizer

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipeline, "train_tokenizer", once)
        yield


@pytest.fixture
def all_cores():
    """This test, and every process it starts, on all the session's cores instead of its
    worker's share: for tests of code that spreads work over cores (`core_pool`)."""
    if not hasattr(os, "sched_setaffinity"):
        yield SESSION_CORES
        return
    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, SESSION_CORES)
    try:
        yield SESSION_CORES
    finally:
        os.sched_setaffinity(0, own)


@pytest.fixture
def system_temp_in_tmp_path(tmp_path, monkeypatch):
    """The system temp directory of this test is its `tmp_path`: what a library leaves there
    (tfds's builder makes a directory in it to fetch a new dataset's info) goes with the test."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path
