"""Every compile into JAX's persistent cache, for test modules whose runs repeat programs."""

import contextlib
import os

import jax

_NAME = "jax_persistent_cache_min_compile_time_secs"


@contextlib.contextmanager
def every_compile():
    """Within the block, every compile of this process and of the processes it starts goes to
    the persistent cache, not only those over the tests' 0.2 s (`tests/conftest.py`): a later
    run of the same tiny model, here or in a fresh process, reads its small programs back."""
    before_env, before = os.environ.get(_NAME.upper()), getattr(jax.config, _NAME)
    os.environ[_NAME.upper()] = "0"  # read by each process JAX starts in
    jax.config.update(_NAME, 0.0)
    try:
        yield
    finally:
        jax.config.update(_NAME, before)
        if before_env is None:
            os.environ.pop(_NAME.upper(), None)
        else:
            os.environ[_NAME.upper()] = before_env
