"""The console scripts of setup.cfg, and what each one's `--help` must say."""

import ast
import configparser
import importlib.util

from tests import REPO_ROOT


def console_scripts() -> dict[str, str]:
    """{script name: 'module:function'} from setup.cfg."""
    cfg = configparser.ConfigParser()
    cfg.read(f"{REPO_ROOT}/setup.cfg")
    lines = cfg["options.entry_points"]["console_scripts"].strip().splitlines()
    return dict(tuple(part.strip() for part in line.split("=")) for line in lines)


def _module_source(module: str) -> ast.Module:
    path = importlib.util.find_spec(module).origin  # finds the file without importing it
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read())


def expected_help(target: str) -> tuple[str, list[str]]:
    """(first line of the module's docstring, the flags its source defines) of `module:function`:
    read from the source, not from the help being checked."""
    tree = _module_source(target.split(":")[0])
    names = [
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "attr", "").startswith("DEFINE_")
        and node.args
        and isinstance(node.args[0], ast.Constant)
    ]
    return ast.get_docstring(tree).splitlines()[0], names


def assert_help(name: str, target: str, text: str) -> None:
    """`text` (a script's --help output) opens with its module's description and names its
    flags: every absl flag its module defines, or, for the harness (lm-eval's own CLI), the
    flags of both. An absl script's lines fit 100 columns: a usage line continued with a lone
    backslash in the docstring's source printed as one line of 130 to 220 characters."""
    first, flags = expected_help(target)
    if not flags:  # gpn-harness: its usage, then lm-eval's argparse help
        first, flags = f"usage: {name} ", ["model_args", "out", "label", "tasks", "include_path"]
    else:
        wide = [line for line in text.splitlines() if len(line) > 100]
        assert not wide, (name, wide)
    assert text.lstrip().startswith(first), (name, text[:500])
    missing = [f for f in flags if f"--{f}" not in text and f"--[no]{f}" not in text]
    assert flags and not missing, (name, missing, text[:2000])
