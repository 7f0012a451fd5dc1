"""The Colab quickstart notebook runs headless on CPU from top to bottom (a few minutes)."""

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "experiments", "colab_quickstart.ipynb")


def test_notebook_is_valid_and_guards_its_install():
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    install = next(c.source for c in nb.cells if c.cell_type == "code" and "pip" in c.source)
    assert 'find_spec("gpn_jax") is None' in install  # skipped when already installed
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")  # stored clean


@pytest.mark.slow
def test_notebook_executes(tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    # the kernel inherits this environment: one CPU device (not the tests' 8), few steps
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("GPN_NOTEBOOK_STEPS", "30")
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
        assert (tmp_path / "run" / "analysis" / f).exists()
