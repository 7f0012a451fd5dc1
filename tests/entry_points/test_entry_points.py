"""Every console script of setup.cfg resolves to a callable that takes no arguments, runs,
and says what it does and which flags it takes."""

import os
import subprocess
import sys

import pytest

from tests.helpers.entry_points import assert_help, console_scripts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_console_scripts_are_zero_argument_callables():
    """Checked in one fresh process per module: entry modules define their absl flags on import."""
    scripts = console_scripts()
    assert {"gpn-train", "gpn-evaluate", "gpn-bench", "gpn-aot"} <= set(scripts)
    check = (
        "import importlib, inspect, sys; m, a = sys.argv[1].split(':'); "
        "fn = getattr(importlib.import_module(m), a); "
        "ps = inspect.signature(fn).parameters.values(); "
        "assert callable(fn) and all(p.default is not p.empty for p in ps), sys.argv[1]"
    )
    for name, target in scripts.items():
        proc = subprocess.run(
            [sys.executable, "-c", check, target], cwd=ROOT, capture_output=True, text=True
        )
        assert proc.returncode == 0, (name, proc.stderr[-1000:])


def _call_target(name: str, *args: str) -> subprocess.CompletedProcess:
    """The script's function called as its console script calls it (argv[0] its name)."""
    module, attr = console_scripts()[name].split(":")
    code = f"import sys; sys.argv = {[name, *args]!r}; from {module} import {attr}; {attr}()"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("name", ["gpn-summary", "gpn-bench"])
def test_console_script_target_reports_a_missing_config_in_one_line(name):
    proc = _call_target(name)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"{name}: error: ") and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize("name", sorted(console_scripts()))
def test_console_script_help_describes_the_command_and_its_flags(name):
    """absl's own --help listed no flag of a console script (it looks for the flags of a
    module named like argv[0]) and exited with status 1."""
    proc = _call_target(name, "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert_help(name, console_scripts()[name], proc.stdout)


def test_helpfull_lists_every_flag_and_exits_0():
    proc = _call_target("gpn-summary", "--helpfull")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--config" in proc.stdout and "--verbosity" in proc.stdout  # absl's own, too
    proc = _call_target("gpn-train", "--helpfull")  # and the config's declared fields
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--config.train.steps (default 10000, at least 1)" in proc.stdout
