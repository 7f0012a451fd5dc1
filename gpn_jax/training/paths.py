"""Moved to `gpn_jax.io.paths` (kept so older imports still work)."""

from gpn_jax.io.paths import *  # noqa: F403
