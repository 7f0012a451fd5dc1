"""A fresh install's first output is the project's own: libtpu (installed by `[dev]`) never
probes for a TPU on a host without one, so no CLI prints its failure, alone or several at once,
a config error stays one line, and the README's main job prints only its own lines."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpn_jax.io import platforms
from tests.environment import one_device_env

ROOT = Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "experiments" / "configs" / "demo.py")
# What libtpu and JAX print when a TPU backend is tried on a host without one.
TPU_NOISE = re.compile(r"tpu|InitGoogle|E0000|Source Location Trace|jellyfish", re.IGNORECASE)


def user_env(fast: bool = True) -> dict:
    """A user's shell: JAX chooses its platforms (the tests' own JAX_PLATFORMS=cpu removed);
    `fast=False`: XLA's default compile flags, as a user's."""
    env = one_device_env(fast=fast)
    env.pop("JAX_PLATFORMS")
    return env | {"PYTHONPATH": str(ROOT)}


def noise(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if TPU_NOISE.search(line)]


@pytest.fixture
def libtpu_installed(monkeypatch):
    real = platforms.importlib.util.find_spec
    monkeypatch.setattr(
        platforms.importlib.util,
        "find_spec",
        lambda name, *a: object() if name == "libtpu" else real(name, *a),
    )
    monkeypatch.setattr(platforms, "gpu_platforms", lambda: [])


def fake_pci(tmp_path, *vendors: str) -> str:
    for i, vendor in enumerate(vendors):
        (tmp_path / f"0000:00:0{i}.0").mkdir()
        (tmp_path / f"0000:00:0{i}.0" / "vendor").write_text(vendor + "\n")
    return str(tmp_path)


def test_cpu_host_with_libtpu_starts_only_its_own_platforms(tmp_path, libtpu_installed):
    environ = {}
    pci = fake_pci(tmp_path, "0x8086", "0x1af4")
    assert platforms.keep_libtpu_quiet(environ, pci) == "cpu"
    assert environ == {"JAX_PLATFORMS": "cpu"}


def test_gpu_host_keeps_its_gpu(tmp_path, libtpu_installed, monkeypatch):
    monkeypatch.setattr(platforms, "gpu_platforms", lambda: ["cuda"])
    environ = {}
    assert platforms.keep_libtpu_quiet(environ, fake_pci(tmp_path, "0x10de")) == "cuda,cpu"
    assert environ["JAX_PLATFORMS"] == "cuda,cpu"


@pytest.mark.parametrize(
    "environ",
    [{"JAX_PLATFORMS": "tpu"}, {"JAX_PLATFORMS": ""}, {"TPU_ACCELERATOR_TYPE": "v5litepod-4"}],
)
def test_a_users_choice_is_left_alone(tmp_path, libtpu_installed, environ):
    before = dict(environ)
    assert platforms.keep_libtpu_quiet(environ, fake_pci(tmp_path, "0x8086")) is None
    assert environ == before


def test_a_tpu_vm_is_left_alone(tmp_path, libtpu_installed):
    environ = {}
    assert platforms.keep_libtpu_quiet(environ, fake_pci(tmp_path, "0x8086", "0x1ae0")) is None
    assert environ == {}


def test_no_libtpu_changes_nothing(tmp_path, monkeypatch):
    real = platforms.importlib.util.find_spec
    monkeypatch.setattr(
        platforms.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "libtpu" else real(name, *a),
    )
    environ = {}
    assert platforms.keep_libtpu_quiet(environ, fake_pci(tmp_path, "0x8086")) is None
    assert environ == {}


def test_accelerator_type_names_the_topologys_slice():
    from gpn_jax.benchmarks.aot.tpus import accelerator_type

    assert accelerator_type("v5e", 4) == "v5litepod-4"
    assert accelerator_type("v5p", 4) == "v5p-8"
    assert accelerator_type("v6e", 1) == "v6e-1"
    assert accelerator_type("v4", 8) == "v4-16"


def test_several_clis_at_once_print_no_tpu_lines():
    command = [sys.executable, "-m", "gpn_jax.summary", f"--config={DEMO}"]
    procs = [
        subprocess.Popen(
            command, env=user_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert "total" in out
        assert noise(err) == [], err


def test_a_config_error_is_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "gpn_jax.train", f"--config={DEMO}", "--workdir=unused"]
        + ["--config.train.steps=-1"],
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "gpn-train: error: config.train.steps must be a positive integer, got -1"
    ]


@pytest.mark.slow
def test_the_main_job_prints_only_the_projects_lines_and_beats_the_unigram_baseline(tmp_path):
    """The README's main job from a user's shell (JAX picks its platforms; XLA's default
    flags), shortened to 50 steps (warm-up 10) to fit the test budget: stderr holds no TPU
    probing, and the held-out PPL is below half the unigram model's (a model that learned
    nothing is at 1x; at 50 steps it is at about 0.39x, at 40 steps still about 0.53x)."""
    proc = subprocess.run(
        [sys.executable, "-m", "gpn_jax.train", f"--config={DEMO}", f"--workdir={tmp_path}/run"]
        + ["--config.train.steps=50", "--config.train.warmup_steps=10"]
        + ["--config.train.eval_every=0"],
        env=user_env(fast=False),  # 50 steps: mostly running, 3x slower with fast compiles
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert noise(proc.stderr) == [], proc.stderr
    assert "held-out PPL" in proc.stdout
    final = json.loads((tmp_path / "run" / "final_metrics.json").read_text())
    assert final["heldout_ppl"] < 0.5 * final["unigram_ppl"], final
    # the launcher ran the steps inline (`train.reuse_step_memory`, `training.host_memory`)
    first = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["run_info"]["cpu_steps_inline"] is True
