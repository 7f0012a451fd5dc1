"""The package stands on its own: its metadata agrees with itself, and a wheel built with
`python -m build` works from a fresh venv, with no checkout on the path.

The slow test copies the tracked sources to a temporary directory (the build writes its
egg-info and build/ next to the sources), builds the sdist and the wheel from it (without
build isolation where setuptools and wheel are installed, else in build's isolated
environment, which fetches them from the package index), installs the wheel with
`--no-deps` into a venv that sees this interpreter's packages (JAX and the rest), and runs,
from a directory outside the checkout with PYTHONPATH unset: every console script's --help
(its description and flags), `gpn-summary` on configs named from the package, a two-step
`gpn-train` of it, `gpn-export`, and `gpn_jax.load(...).generate(...)`.
"""

import configparser
import os
import pathlib
import re
import shutil
import site
import subprocess
import sys

import pytest

import gpn_jax
from tests.environment import xla_flags
from tests.helpers.entry_points import assert_help, console_scripts

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _setup_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return cfg


def test_one_version_license_and_citation():
    cfg = _setup_cfg()
    assert cfg["metadata"]["version"] == "attr: gpn_jax.__version__"
    assert re.fullmatch(r"\d+\.\d+\.\d+", gpn_jax.__version__)
    citation = (ROOT / "CITATION.cff").read_text()
    assert re.search(r"^version: (\S+)$", citation, re.M).group(1) == gpn_jax.__version__
    assert 'title: "A Single-Layer Model Can Do Language Modeling"' in citation
    assert "arXiv:2605.10643" in citation
    assert re.search(r"^license: (\S+)$", citation, re.M).group(1) == "Apache-2.0"
    assert cfg["metadata"]["license"] == "Apache-2.0"
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    assert "Copyright The gpn_jax Authors" in license_text


def test_python_requires_is_what_the_code_needs():
    """StrEnum and datetime.UTC are 3.11's; the dev extra names each package once for each
    environment marker (libtpu twice: one version per Python, as each Python's jax pins it)."""
    cfg = _setup_cfg()
    assert cfg["options"]["python_requires"] == ">=3.11"
    dev = [ln.split("#")[0].strip() for ln in cfg["options.extras_require"]["dev"].splitlines()]
    names = [
        (re.match(r"[A-Za-z0-9_.\-]+", ln).group().lower(), ln.partition(";")[2].strip())
        for ln in dev
        if ln
    ]
    assert len(names) == len(set(names)), f"listed twice in [dev]: {names}"


def test_importing_the_package_loads_no_jax():
    code = "import sys, gpn_jax; print(gpn_jax.__version__, 'jax' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.split() == [gpn_jax.__version__, "False"]


def _copy_sources(dest: pathlib.Path) -> pathlib.Path:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout.split()  # fmt: skip
    for rel in files:
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def _build_requirements_installed() -> bool:
    """pyproject.toml's build requirements (setuptools>=68, wheel) are installed here."""
    from importlib import metadata

    try:
        major = int(metadata.version("setuptools").split(".")[0])
        metadata.version("wheel")
    except (metadata.PackageNotFoundError, ValueError):
        return False
    return major >= 68


def _build_wheel(tmp: pathlib.Path) -> pathlib.Path:
    src = _copy_sources(tmp / "src")
    dist = tmp / "dist"
    # without isolation where pyproject.toml's build requirements are installed (no network),
    # else build's own isolated environment (which installs them from the package index)
    isolation = ["--no-isolation"] if _build_requirements_installed() else []
    out = subprocess.run(
        [sys.executable, "-m", "build", *isolation, "--outdir", str(dist), str(src)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (wheel,) = dist.glob("gpn_jax-*.whl")
    return wheel


def _site_packages() -> list[str]:
    """This interpreter's package directories (the README's environment: a venv or not)."""
    dirs = site.getsitepackages()
    if site.ENABLE_USER_SITE:  # True, False, or None (disabled for security)
        dirs.append(site.getusersitepackages())
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def _venv(tmp: pathlib.Path, wheel: pathlib.Path) -> pathlib.Path:
    """A new venv that sees this interpreter's packages (JAX and the rest, pip too) after its
    own, through a .pth file: `--system-site-packages` would show the base interpreter's
    instead, which a venv-based install leaves bare. The directories are added as plain paths,
    so their own .pth files (the checkout's editable-install hook) do not run."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    own = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (pathlib.Path(own) / "_outer_packages.pth").write_text("\n".join(_site_packages()) + "\n")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    # without PYTHONPATH: a checkout on it (its gpn_jax.egg-info) reads as gpn_jax installed,
    # and pip skipped the wheel ("already installed with the same version")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([*pip, str(wheel)], check=True, capture_output=True, timeout=300, env=env)
    return venv


def _runner(venv: pathlib.Path, cwd: pathlib.Path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # one CPU device, compiled with the tests' flags (what is tested is the install, not XLA)
    env |= {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags(devices=1)}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"

    def run(*args, codes=(0,)) -> str:
        out = subprocess.run(
            list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=900
        )
        assert out.returncode in codes, f"{args}: {out.stderr[-2000:]}"
        assert "Traceback" not in out.stderr, f"{args}: {out.stderr[-2000:]}"
        return out.stdout + out.stderr

    return run


@pytest.mark.slow
def test_the_wheel_works_from_a_fresh_venv(tmp_path):
    wheel = _build_wheel(tmp_path)
    venv = _venv(tmp_path, wheel)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = _runner(venv, elsewhere)
    python = str(venv / "bin" / "python")
    where = run(python, "-c", "import gpn_jax; print(gpn_jax.__file__, gpn_jax.__version__)")
    path, version = where.split()[-2:]
    assert path.startswith(str(venv)) and version == gpn_jax.__version__  # not the checkout's
    package = pathlib.Path(path).parent
    named = ["demo", "gpn_m_1l_130m", "gpn_1l_130m", "gpn_m_2l_130m", "transformer_130m"]
    named += ["gdn_130m"]
    configs = [f"configs/{name}.py" for name in named]
    for pattern in ("kernels/cpu/*.cc", "kernels/cpu/*.h", *configs):
        assert list(package.glob(pattern)), f"the wheel lacks gpn_jax/{pattern}"
    for script, target in console_scripts().items():
        assert_help(script, target, run(str(venv / "bin" / script), "--help"))
    demo = "--config=demo"  # a named config: the package's own file, no checkout needed
    assert "parameters" in run("gpn-summary", demo)
    assert "129,151,902" in run("gpn-summary", "--config=gpn_m_1l_130m")
    short = ["--config.train.steps=2", "--config.train.checkpoint_every=2"]
    short += ["--config.train.eval_every=0", "--config.train.final_eval_batches=1"]
    run("gpn-train", demo, "--workdir=run", *short)
    run("gpn-export", "--workdir=run", "--out=model")
    code = "import gpn_jax; print(repr(gpn_jax.load('model').generate('The', max_new_tokens=4)))"
    text = run(python, "-c", code).strip().splitlines()[-1]
    assert text.startswith("'The"), text
