"""Tests mirror the package: tests/core, tests/models, ... test gpn_jax/core, gpn_jax/models, ...;
tests of the entry points (gpn_jax/*.py) and of the repository as a whole sit here."""

import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
