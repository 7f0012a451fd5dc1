"""The `gpn_jax.train` command: one-line errors on bad input, SIGTERM, and the demo main job."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from gpn_jax.data.tokenizer import train_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = "experiments/configs/gpn_m_tiny.py"


def train_cmd(workdir, *flags, config=TINY):
    return [
        sys.executable,
        "-m",
        "gpn_jax.train",
        f"--config={config}",
        f"--workdir={workdir}",
        *flags,
    ]


def user_env():
    """The environment of a user's shell: one CPU device (no forced test devices)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return dict(env, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")


def run_train(workdir, *flags, config=TINY, timeout=300):
    env = user_env()
    return subprocess.run(
        train_cmd(workdir, *flags, config=config),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def assert_one_line_error(proc, pattern, workdir=None):
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gpn-train: error: "), lines[0]
    assert pattern in lines[0], lines[0]
    if workdir is not None:  # nothing partial was checkpointed
        ckpts = os.path.join(workdir, "checkpoints")
        assert not os.path.isdir(ckpts) or not os.listdir(ckpts)


def test_missing_corpus(tmp_path):
    proc = run_train(tmp_path / "w", "--config.data.source=/no/such/corpus")
    assert_one_line_error(proc, "data path not found: /no/such/corpus", tmp_path / "w")


def test_empty_corpus(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    proc = run_train(tmp_path / "w", f"--config.data.source={empty}")
    assert_one_line_error(proc, "empty", tmp_path / "w")


def test_unknown_config_field(tmp_path):
    proc = run_train(tmp_path / "w", "--config.train.stpes=3")
    assert_one_line_error(proc, "unknown config field or bad value in --config.train.stpes=3")


def test_unknown_metric_writer(tmp_path):
    proc = run_train(tmp_path / "w", "--config.logging.writers=jsonl,csv")
    assert_one_line_error(proc, "unknown metric writer 'csv'", tmp_path / "w")


def test_unknown_dataset(tmp_path):
    proc = run_train(tmp_path / "w", "--config.data.source=tfds:no_such_dataset_xyz")
    assert_one_line_error(proc, "no_such_dataset_xyz", tmp_path / "w")


def test_non_writable_workdir(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    proc = run_train(blocker / "run")
    assert_one_line_error(proc, "is not writable")


def test_tokenizer_vocab_mismatch(tmp_path):
    tok = str(tmp_path / "tok290.model")
    train_tokenizer(["a small corpus of words, letters and digits 0123456789."] * 50, 290, tok)
    proc = run_train(tmp_path / "w", f"--config.data.tokenizer_path={tok}")
    assert_one_line_error(proc, "vocab", tmp_path / "w")


def test_sequence_not_divisible_by_remat_segment(tmp_path):
    proc = run_train(tmp_path / "w", "--config.model.remat_segment=5")
    assert_one_line_error(
        proc, "sequence length 32 is not divisible by the remat segment 5", tmp_path / "w"
    )


def test_sigterm_saves_and_exits_cleanly_then_resumes(tmp_path):
    workdir = tmp_path / "w"
    flags = [
        "--config.train.steps=100000",
        "--config.train.log_every=1",
        "--config.train.batch_size=8",
    ]
    env = user_env()
    proc = subprocess.Popen(
        train_cmd(workdir, *flags),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = workdir / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and not (
        metrics.exists() and metrics.read_text().count('"loss"') >= 3  # rows after run_info
    ):
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "SIGTERM: saved step" in out
    step = int(out.split("SIGTERM: saved step ")[1].split()[0])
    assert step >= 3 and os.path.isdir(workdir / "checkpoints" / str(step))
    again = run_train(workdir, f"--config.train.steps={step + 2}", "--config.train.batch_size=8")
    assert again.returncode == 0, again.stderr
    assert f"Resuming from checkpoint step {step}" in again.stdout
    assert json.loads((workdir / "final_metrics.json").read_text())["step"] == step + 2


@pytest.mark.slow
def test_demo_main_job_beats_the_unigram_baseline(tmp_path):
    """The README's main job, shortened to 80 steps to fit the test budget."""
    proc = run_train(
        tmp_path / "demo",
        "--config.train.steps=80",
        "--config.train.eval_every=0",
        config="experiments/configs/demo.py",
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    final = json.loads((tmp_path / "demo" / "final_metrics.json").read_text())
    assert final["heldout_ppl"] < 0.5 * final["unigram_ppl"], final
