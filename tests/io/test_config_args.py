"""`gpn_jax.io.config_args`: the package's named configs, found without a checkout."""

import os
import subprocess
import sys

import pytest

from gpn_jax.io import config_args
from tests import REPO_ROOT

FAMILY = ["demo", "gdn_130m", "gpn_1l_130m", "gpn_m_1l_130m", "gpn_m_2l_130m", "transformer_130m"]


def test_the_demo_and_the_130m_family_are_named_configs_in_the_package():
    assert set(FAMILY) <= set(config_args.named_configs())
    assert "recipe" not in config_args.named_configs()  # no get_config: not a config
    package = os.path.join(REPO_ROOT, "gpn_jax", "configs")
    assert os.path.samefile(config_args.NAMED_DIR, package)


@pytest.mark.parametrize(
    "given, want",
    [
        ("--config=gpn_m_1l_130m:cpu", "--config={dir}/gpn_m_1l_130m.py:cpu"),
        ("--config=demo", "--config={dir}/demo.py"),
        ("--config=experiments/configs/demo.py", "--config=experiments/configs/demo.py"),
        ("--config=no_such_config", "--config=no_such_config"),  # check() says what is named
        ("--config.train.steps=2", "--config.train.steps=2"),
    ],
)
def test_a_name_becomes_the_packages_file(given, want):
    argv = ["gpn-train", given, "--workdir=w"]
    assert config_args.resolve(argv) == [
        "gpn-train",
        want.format(dir=config_args.NAMED_DIR),
        "--workdir=w",
    ]


def test_an_unknown_name_lists_the_named_configs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = config_args.check(["gpn-train", "--config=gpn_m_1l_13m"])
    assert line.startswith("--config=gpn_m_1l_13m: no such file or named config (named: demo, ")
    assert "gpn_m_1l_130m" in line and "\n" not in line


def test_a_console_script_names_a_config_outside_the_checkout(tmp_path):
    """Issue 84: without the checkout a user could name no config but by the package's path."""
    code = "import sys; sys.argv = ['gpn-summary', '--config=demo']; from gpn_jax.summary import run; run()"
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "1,118,856" in out.stdout  # the demo's parameters (its docstring's count)


def test_gpn_train_help_names_every_named_config():
    out = subprocess.run(
        [sys.executable, "-m", "gpn_jax.train", "--help"], cwd=REPO_ROOT, capture_output=True,
        text=True, timeout=300, env=dict(os.environ, PYTHONPATH=REPO_ROOT),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    text = " ".join(out.stdout.split())  # absl wraps the flag's help
    missing = [n for n in config_args.named_configs() if n not in text]
    assert not missing, missing
