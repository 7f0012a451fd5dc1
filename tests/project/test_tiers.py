"""The fast tier: every test that starts a process is marked `process` at collection, through
its own source, a function of its module or a `tests.helpers` function it calls; a test that
runs only in its worker is not."""

import importlib

from tests.helpers import tiers


def _marked(module: str, test: str, fixtures=()) -> bool:
    mod = importlib.import_module(module)
    return tiers.starts_processes(getattr(mod, test), mod, fixtures)


def test_a_test_that_runs_a_cli_is_marked_directly_or_through_a_helper():
    # its own subprocess.run of `python -m gpn_jax.train`
    assert _marked("tests.entry_points.test_train_cli",
                   "test_sigterm_saves_and_exits_cleanly_then_resumes")  # fmt: skip
    # through a function of its module that starts the bench's CLI
    assert _marked("tests.benchmarks.test_bench", "test_cli_unknown_suite_is_one_line")


def test_a_test_that_runs_in_its_worker_is_not_marked():
    assert not _marked(
        "tests.project.test_tiers", "test_a_test_that_runs_in_its_worker_is_not_marked"
    )
    assert not _marked("tests.benchmarks.test_traffic",
                       "test_while_loops_multiply_by_their_trip_count")  # fmt: skip


def test_a_planted_helper_is_followed(tmp_path, monkeypatch):
    (tmp_path / "planted_tiers.py").write_text(
        "import subprocess, sys\n"
        "def run_it():\n    return subprocess.run([sys.executable, '-c', 'pass'])\n"
        "def test_uses_it():\n    run_it()\n"
        "def test_alone():\n    assert 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("planted_tiers")
    mod.run_it.__module__ = "tests.planted"  # a test-side function, as tests/ defines them
    tiers.spawning_names.cache_clear()
    assert tiers.starts_processes(mod.test_uses_it, mod)
    assert not tiers.starts_processes(mod.test_alone, mod)
