"""Moved to `gpn_jax.io.files` (kept so older imports still work)."""

from gpn_jax.io.files import *  # noqa: F403
