"""Every console script of setup.cfg resolves to a callable that takes no arguments, and runs."""

import configparser
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def console_scripts() -> dict[str, str]:
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    lines = cfg["options.entry_points"]["console_scripts"].strip().splitlines()
    return dict(tuple(part.strip() for part in line.split("=")) for line in lines)


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


@pytest.mark.parametrize("name", ["gpn-summary", "gpn-bench"])
def test_console_script_target_reports_a_missing_config_in_one_line(name):
    module, attr = console_scripts()[name].split(":")
    code = f"import sys; sys.argv = [{name!r}]; from {module} import {attr}; {attr}()"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"{name}: error: ") and proc.stderr.count("\n") == 1, proc.stderr
