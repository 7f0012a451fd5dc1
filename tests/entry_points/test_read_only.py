"""Read-only consumers: `gpn_jax.evaluate`, `generate` and `analyze` never write into the run's
workdir. Every file's and directory's size and mtime (nanoseconds) is recorded before and after
each CLI: a created-then-removed probe or temp file still changes its directory's mtime, and
permission bits would prove nothing when the tests run as root."""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.training import tiny_two_step_config as tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def snapshot(top: str) -> dict:
    """{relative path: (kind, size, mtime_ns)} of `top` and everything below it."""
    seen = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in [".", *dirnames, *filenames]:
            path = os.path.normpath(os.path.join(dirpath, name))
            st = os.lstat(path)
            kind = "dir" if os.path.isdir(path) else "file"
            seen[os.path.relpath(path, top)] = (kind, st.st_size, st.st_mtime_ns)
    return seen


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny run trained by the trainer itself: every file training writes is there."""
    from tests.helpers.training import train_on_one_device

    workdir = str(tmp_path_factory.mktemp("run"))
    c = tiny_config()
    c.train.update(dict(log_every=1, final_eval_batches=1))
    train_on_one_device(c, workdir)
    return workdir


def cli(module, *args, cwd):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True, text=True, env=env, timeout=300, cwd=cwd,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_evaluate_generate_analyze_leave_the_workdir_untouched(trained, tmp_path):
    before = snapshot(trained)
    assert {"metrics.jsonl", "final_metrics.json", "tokenizer.model"} <= set(before)
    assert any(p.startswith("checkpoints") for p in before)
    out = tmp_path / "eval.json"
    # cwd=the workdir: a stray relative write would land there and be caught too
    cli("gpn_jax.evaluate", f"--workdir={trained}", "--eval=ppl,stream", f"--out={out}",
        "--ppl_max_batches=2", "--stream_buckets=0,256", cwd=trained)  # fmt: skip
    assert snapshot(trained) == before
    assert json.loads(out.read_text())["ppl"]["tokens"] > 0  # results went to --out only
    gen = cli("gpn_jax.generate", f"--workdir={trained}", "--prompt=The list", "--greedy",
              "--max_new_tokens=3", cwd=trained)  # fmt: skip
    assert gen.stdout.startswith("The list")
    assert snapshot(trained) == before
    cli("gpn_jax.analyze", f"--workdir={trained}", f"--out={tmp_path / 'an'}",
        "--max_batches=2", "--sample_size=64", "--ablation_batches=-1", "--nofigures",
        cwd=trained)  # fmt: skip
    assert snapshot(trained) == before
    assert (tmp_path / "an" / "report.md").exists()


def test_analyze_needs_out(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "gpn_jax.analyze", f"--workdir={tmp_path}"],
        capture_output=True, text=True, env=env, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "gpn-analyze: error: --out is required (the analysis never writes into the run's workdir)"
    ]
