"""The XLA environment of the tests and of every process they start.

Tests check behaviour (equivalences, exact values, errors), not speed, and most of a cold run
of the suite is XLA compiling many small programs, so every test process and subprocess compiles
at LLVM's cheapest optimisation level (programs compared across processes, a CLI run against an
in-process run, are then built the same way). Measured from an empty compilation cache, one
process, 2-core AVX2: the micro compare, the demo main job and the sharded stateful step took
173 s together at the default level and 146 s at this one (the sharded step 43 -> 25 s; the demo,
which is mostly running, unchanged).
"""

import os

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"

# Per-compile options (`.lower(...).compile(PRODUCTION_HLO)`) for the tests that read the
# optimised HLO (collectives per loop body): the fusion emitters change the HLO pipeline (the
# loop structure it leaves), so those programs are built as a user's would be.
PRODUCTION_HLO = {"xla_cpu_use_fusion_emitters": True}


def xla_flags(devices: int | None = None) -> str:
    """XLA_FLAGS for a test process: the fast compile level, and `devices` forced CPU devices."""
    forced = [f"--xla_force_host_platform_device_count={devices}"] if devices else []
    return " ".join([FAST_COMPILE, *forced])


def one_device_env(**extra: str) -> dict:
    """A user's shell on one CPU device (not the tests' 8 forced devices), compiled at the
    tests' level."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return env | {"XLA_FLAGS": xla_flags(), "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"} | extra
