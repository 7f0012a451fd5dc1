"""Every third-party module the code imports is declared in setup.cfg.

A package that is only installed by hand on one machine passes every test there and fails on a
fresh one (grain was imported by the data pipeline for weeks without being declared). The code
is parsed with `ast` (nothing is imported); each top-level module name that is not in the
standard library or this project is mapped to the distribution that provides it (installed
metadata, `importlib.metadata.packages_distributions`) and must be named in `install_requires`
(for gpn_jax/ and experiments/) or in `install_requires` + `[dev]` (for tests/: the README's
`pip install -e ".[dev]"` must bring everything the test command imports).
"""

import ast
import configparser
import importlib.metadata
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
OWN = {"gpn_jax", "experiments", "tests"}


def imported_modules(folder: pathlib.Path) -> set[str]:
    names = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in OWN}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> tuple[set[str], set[str]]:
    """(install_requires, install_requires + [dev]) as canonical distribution names."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")

    def names(text: str) -> set[str]:
        lines = [x.split("#")[0].strip() for x in text.splitlines()]
        return {_canonical(re.match(r"[A-Za-z0-9_.\-]+", x).group()) for x in lines if x}

    core = names(cfg["options"]["install_requires"])
    return core, core | names(cfg["options.extras_require"]["dev"])


def missing(folder: pathlib.Path, allowed: set[str]) -> dict[str, list[str]]:
    """Modules imported under `folder` whose distributions are not in `allowed`."""
    providers = importlib.metadata.packages_distributions()
    out = {}
    for module in sorted(imported_modules(folder)):
        dists = [_canonical(d) for d in providers.get(module, [])]
        if not dists or not set(dists) & allowed:
            out[module] = dists or ["<not installed>"]
    return out


def test_library_and_experiments_import_only_declared_requirements():
    core, _ = declared()
    # Optional imports, each guarded where it is used and declared as an extra:
    # lm_eval ([eval], gpn_jax.harness), wandb ([wandb], the metric writer); datasets and
    # huggingface_hub come with lm_eval (experiments.harness_table sets them offline).
    optional = {"lm_eval", "wandb", "datasets", "huggingface_hub"}
    for folder in ("gpn_jax", "experiments"):
        gaps = {m: d for m, d in missing(ROOT / folder, core).items() if m not in optional}
        assert not gaps, f"{folder}/ imports modules setup.cfg does not require: {gaps}"


def test_tests_import_only_what_dev_installs():
    _, dev = declared()
    gaps = missing(ROOT / "tests", dev)
    assert not gaps, f"tests/ import modules neither install_requires nor [dev] provides: {gaps}"


def test_dev_brings_the_test_only_packages():
    # lm-eval (tests/eval/test_harness.py), hypothesis (property tests) and libtpu (a line with
    # an environment marker) come with [dev], not with the library
    core, dev = declared()
    assert {"lm-eval", "hypothesis", "libtpu", "pytest"} <= dev - core


def test_an_undeclared_import_is_found(tmp_path):
    (tmp_path / "m.py").write_text("import os\nimport numpy.linalg\nfrom grain import python\n")
    assert imported_modules(tmp_path) == {"numpy", "grain"}
    assert missing(tmp_path, allowed=set()) == {"numpy": ["numpy"], "grain": ["grain"]}
    assert missing(tmp_path, allowed={"numpy", "grain"}) == {}
