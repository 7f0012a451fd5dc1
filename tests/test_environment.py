"""tests/environment.py and tests/conftest.py: how the suite shares the machine's cores."""

import os

import pytest

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
