"""The Colab quickstart notebook runs headless on CPU from top to bottom (a few minutes)."""

import os
import sys

import pytest

from tests.environment import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "experiments", "colab_quickstart.ipynb")


def test_notebook_is_valid_and_guards_its_install():
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    install = next(s for s in code if '"pip", "install"' in s)
    assert 'find_spec("gpn_jax") is None' in install  # skipped when already installed
    assert "_find_checkout()" in install and "_accelerator_extra()" in install
    # one marked setting, a Colab form field empty as committed, or the environment variable
    (setting,) = [s for s in code if "THE ONE SETTING" in s]
    assert 'GPN_JAX_SOURCE = ""  # @param {type:"string"}' in setting
    assert 'os.environ.get("GPN_JAX_SOURCE", "")' in setting
    assert not any(p in s for s in code for p in ("YOUR_", "<owner>", "REPO_URL"))
    assert not any("older checkout" in s or "except ImportError" in s for s in code)
    assert "config.mesh.data = N_DEVICES" in "".join(code)  # jax.devices() decides the mesh
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")  # stored clean


class _Pip:
    """subprocess.run as the install cell calls it: records pip's arguments, exits with `rc`."""

    def __init__(self, rc=0, stderr=""):
        self.calls, self.rc, self.stderr = [], rc, stderr

    def __call__(self, args, capture_output, text):
        import subprocess

        self.calls.append(args)
        return subprocess.CompletedProcess(args, self.rc, "", self.stderr)


def _run_install_cell(monkeypatch, capsys, cwd, source="", pip=None):
    """Executes the install cells in `cwd` as if gpn_jax were not installed; returns pip's
    target, the runtime's extra and the line the cell printed."""
    import importlib.util
    import subprocess

    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    setting = next(s for s in code if "THE ONE SETTING" in s)
    install = next(s for s in code if '"pip", "install"' in s)
    pip = pip or _Pip()
    monkeypatch.setenv("GPN_JAX_SOURCE", source)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(subprocess, "run", pip)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(cwd)
    namespace = {}
    exec(setting + "\n" + install, namespace)
    (args,) = pip.calls
    (line,) = capsys.readouterr().out.splitlines()
    return args[args.index("install") + 2 :], namespace["_accelerator_extra"](), line


def test_install_cell_picks_the_setting_the_checkout_or_an_upload(monkeypatch, capsys, tmp_path):
    target, extra, line = _run_install_cell(monkeypatch, capsys, os.path.join(ROOT, "experiments"))
    assert target == ["-e", ROOT + extra]  # opened from this checkout: no setting needed
    assert line == f"installed gpn_jax from this checkout ({ROOT})"
    (tmp_path / "gpn_jax-0.1.0-py3-none-any.whl").write_text("")
    target, extra, line = _run_install_cell(monkeypatch, capsys, tmp_path)
    assert target == ["gpn_jax-0.1.0-py3-none-any.whl" + extra]  # an uploaded wheel
    assert line == "installed gpn_jax from the uploaded gpn_jax-0.1.0-py3-none-any.whl"
    url = "git+https://example.org/gpn_jax.git"
    target, extra, line = _run_install_cell(monkeypatch, capsys, tmp_path, url)
    assert target == [f"gpn_jax{extra} @ {url}"]
    assert line == f"installed gpn_jax from GPN_JAX_SOURCE ({url})"
    target, extra, line = _run_install_cell(monkeypatch, capsys, tmp_path, ROOT)
    assert target == [ROOT + extra] and line == f"installed gpn_jax from GPN_JAX_SOURCE ({ROOT})"


@pytest.mark.parametrize("source", ["", "gpn_jax"], ids=["nothing found", "a bare name"])
def test_install_cell_never_installs_a_package_by_name(monkeypatch, capsys, tmp_path, source):
    """Issue 84: with nothing found, the cell ran `pip install gpn_jax` from the package index,
    where no such project of ours exists (a name anyone could register). It says in one line
    what to provide instead, and pip never runs."""
    pip = _Pip()
    with pytest.raises(RuntimeError) as raised:
        _run_install_cell(monkeypatch, capsys, tmp_path, source, pip=pip)
    message = str(raised.value)
    assert "\n" not in message and not pip.calls
    assert "a git URL" in message and "wheel" in message, message


@pytest.mark.slow
def test_notebook_executes(tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    # the kernel inherits this environment: one CPU device (not the tests' 8), the tests' fast
    # compile flags (at a few steps the notebook mostly compiles: its train step alone compiles
    # several times slower at XLA's defaults), and 3 steps: enough for every cell (a logged
    # loss curve, a checkpoint, the held-out evaluation), what the model learns is not checked
    monkeypatch.setenv("XLA_FLAGS", xla_flags())
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("GPN_NOTEBOOK_STEPS", "3")
    monkeypatch.setenv("GPN_NOTEBOOK_WORKDIR", str(tmp_path / "run"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": os.path.join(ROOT, "experiments")}},
    )
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 4  # training curve + geometry, horizons, mean direction
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "held-out PPL" in text and "The built-in function" in text
    for f in ("report.md", "metrics.json", "geometry.png", "horizons.png", "mean_direction.png"):
        assert (tmp_path / "run_analysis" / f).exists()
    assert not (tmp_path / "run" / "analysis").exists()  # the run's workdir is only read
