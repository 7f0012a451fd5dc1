"""Paper configs land at 130M; the summary command prints the counts."""

import importlib
import json
import os
import pathlib
import subprocess
import sys

import pytest

from gpn_jax.models import accounting, factory
from gpn_jax.models import configs as model_configs

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load(name, arg=None):
    return importlib.import_module(f"experiments.configs.{name}").get_config(arg)


def test_gpn_m_1l_parameter_count_is_pinned():
    # The paper's stated sizes; a change here means the model no longer matches the paper's table.
    counts = accounting.param_counts(factory.build_model(load("gpn_m_1l_130m").model))
    assert counts["total"] == 129_151_902
    assert counts["groups"]["embed"] == 32_000 * 768


@pytest.mark.parametrize("name", ["gpn_m_1l_130m", "gpn_m_2l_130m", "gpn_1l_130m"])
def test_paper_configs_are_within_3_percent_of_130m(name):
    total = accounting.param_counts(factory.build_model(load(name).model))["total"]
    assert abs(total / 130e6 - 1) <= 0.03, total


def test_memory_cells_match_spec_table():
    m1, m2 = load("gpn_m_1l_130m").model, load("gpn_m_2l_130m").model
    assert m1.n_heads * m1.d_key * m1.d_value == 491_520
    assert abs(m2.n_heads * m2.d_key * m2.d_value - 360_000) < 1000


def test_cpu_variant_shrinks_any_config():
    c = load("gpn_m_1l_130m", "cpu")
    assert c.model.d_model <= 128 and c.train.seq_len == 128
    with pytest.raises(ValueError, match="unknown config variant"):
        load("gpn_m_1l_130m", "gpu")


def test_model_field_rules_are_read_off_the_dataclass_fields():
    """`:cpu`, the "same model?" check and validation read each field's own metadata: the
    130M GPN+M shrinks field by field, and the math-free set is the switches'."""
    m = load("gpn_m_1l_130m", "cpu").model
    full = load("gpn_m_1l_130m").model
    assert (m.vocab_size, m.d_model, m.n_layers, m.compute_dtype) == (2048, 128, 1, "float32")
    assert (m.n_heads, m.d_key, m.d_value) == (min(full.n_heads, 2), 16, 32)
    assert m.remat_segment == (32 if full.remat_segment else 0)
    want = {"loss_chunk", "scan_impl", "scan_unroll", "remat_segment", "remat_parallel", "remat"}
    want |= {"compute_dtype", "memory_dtype"}
    assert model_configs.math_free_fields() == want | {"kernels", "attention"}
    assert model_configs.field_rule(model_configs.MINIMUM)["chunk_size"] == 0


def test_unknown_model_field_is_rejected():
    c = load("gpn_m_tiny")
    c.model.unlock()
    c.model.d_modle = 3
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['d_modle'\]"):
        factory.build_model(c.model)


def test_summary_command_json():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpn_jax.summary",
            "--config=experiments/configs/gpn_m_1l_130m.py",
            "--json",
            "--batch_size=16",
            "--device_spec=h100,v5e",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    s = json.loads(out)
    assert s["params"]["total"] == 129_151_902
    assert s["flops_per_token"]["train"] == 3 * s["flops_per_token"]["forward"]
    assert s["batch_size"] == 16 and s["bytes_per_token"]["memory"] > 0
    # 15 x 128 x 256 cells x (7 float32 passes + the float32 cotangent read + written)
    assert s["bytes_per_token"]["memory"] == 491_520 * (4 * 7 + 8)
    assert sorted(s["roofline"]) == ["H100 SXM", "TPU v5e"]


def test_demo_config_is_shipped_and_the_experiments_path_is_the_same_config():
    from gpn_jax.configs import demo

    assert load("demo").to_dict() == demo.get_config().to_dict()
    # the parameter count its docstring states
    assert accounting.param_counts(factory.build_model(demo.get_config().model))["total"] == (
        1_118_856
    )


QUICKSTART = """\
import importlib.util, pathlib, sys
assert importlib.util.find_spec("experiments") is None, "experiments/ must not be importable"
from gpn_jax.configs import demo
from gpn_jax.training.loop import train_and_evaluate
config = demo.get_config()
assert callable(train_and_evaluate) and config.model.family == "gpn"
print(pathlib.Path(sys.modules["gpn_jax"].__file__).resolve().parent)
"""


def test_python_quickstart_works_from_the_installed_package_alone(tmp_path):
    """The README's Python quickstart, run outside the checkout with only the `gpn_jax` package on
    the path (what `pip install` ships: no `experiments/`): it builds the config and finds the
    trainer (no training)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "gpn_jax").symlink_to(ROOT / "gpn_jax", target_is_directory=True)
    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", QUICKSTART],
        cwd=run_dir,
        env={**env, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == str(ROOT / "gpn_jax")  # this checkout's package, not another
