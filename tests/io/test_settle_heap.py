"""`cli.settle_heap`: what a command has imported leaves the garbage collector's passes, and
garbage made afterwards is still collected (checked in a fresh process: the test worker's own
collector settings are the conftest's)."""

import subprocess
import sys

from tests import REPO_ROOT

CHECK = """
import gc, weakref
import numpy  # an imported stack
from gpn_jax.io import cli

class Node:
    pass

before = gc.get_freeze_count()
cli.settle_heap()
assert gc.get_freeze_count() > before + 1000, (before, gc.get_freeze_count())
assert gc.get_threshold() == (10_000, 10, 10), gc.get_threshold()
a, b = Node(), Node()
a.other, b.other = b, a  # a cycle: only the cyclic collector frees it
alive = weakref.ref(a)
del a, b
gc.collect()
assert alive() is None
print("ok")
"""


def test_settle_heap_freezes_the_imported_stack_and_still_collects_new_cycles():
    proc = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
