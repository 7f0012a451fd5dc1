"""Test setup: 8 forced CPU host devices (for sharding tests) before JAX starts."""

import os
import tempfile

from tests.environment import xla_flags

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + xla_flags(devices=8)).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Many tests (and the CLI subprocesses they start) compile the same tiny train steps: share
# compiled executables through JAX's persistent cache for the duration of the machine.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "gpn_jax_test_xla_cache")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")


def pytest_collection_modifyitems(config, items):
    """Slow end-to-end tests first (stable order otherwise): with `-n 2 --dist worksteal` a
    minute-long test that starts last leaves the other worker idle until it ends."""
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
