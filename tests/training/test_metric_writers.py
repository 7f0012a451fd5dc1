"""config.logging.writers: JSONL, TensorBoard and Weights & Biases (offline) get the same rows,
and each records the run's config and git revision."""

import glob
import json
import os
import subprocess
import sys

import pytest

from experiments.configs import gpn_m_tiny
from gpn_jax.configs import blocks
from gpn_jax.training.metric_writer import parse_writers
from tests import REPO_ROOT as ROOT
from tests.helpers.training import train_on_one_device


def tiny_config(writers):
    c = gpn_m_tiny.get_config()
    c.train.update(dict(batch_size=8, steps=3, checkpoint_every=3, eval_every=0, log_every=1))
    c.train.final_eval_batches = 1
    c.logging.writers = writers
    return c


def wandb_records(workdir) -> list[dict]:
    """The offline run's records, read back by wandb's own reader of its .wandb log."""
    (path,) = glob.glob(os.path.join(workdir, "wandb", "offline-run-*", "run-*.wandb"))
    proc = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", path],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


@pytest.mark.slow
def test_all_writers_record_rows_config_and_revision(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))  # ours: <workdir>/wandb wins
    workdir = str(tmp_path / "run")
    config = tiny_config("jsonl,tensorboard,wandb")
    train_on_one_device(config, workdir)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    revision = head.stdout.strip()
    assert len(revision) == 40

    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    info = rows[0]["run_info"]
    assert info["git_revision"].startswith(revision)
    assert info["config"] == json.loads(json.dumps(config.to_dict()))
    losses = {r["step"]: r["loss"] for r in rows if "loss" in r}
    assert sorted(losses) == [1, 2, 3]

    (events,) = glob.glob(os.path.join(workdir, "tensorboard", "events.out.tfevents.*"))
    blob = open(events, "rb").read()
    assert b"run_info/git_revision" in blob and revision.encode() in blob
    assert b"run_info/config" in blob and b'"d_model": 64' in blob

    records = wandb_records(workdir)
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    logged = {h["_step"]: h["loss"] for h in history if "loss" in h}
    assert logged == losses  # the same float64 values, step by step
    (run,) = [r["run"] for r in records if r["type"] == "run"]
    wb_config = run["config"]["update"]
    assert wb_config["git_revision"] == info["git_revision"]
    assert wb_config["model"] == info["config"]["model"] and wb_config["train"]["steps"] == 3
    assert run["run_id"] == open(os.path.join(workdir, "wandb", "gpn_jax_run_id")).read()


def test_unknown_writer_is_a_one_line_config_error(tmp_path):
    with pytest.raises(ValueError, match="unknown metric writer 'csv' in config.logging.writers"):
        train_on_one_device(tiny_config("jsonl,csv"), str(tmp_path / "run"))
    assert not os.path.exists(tmp_path / "run" / "checkpoints")


def test_configs_without_a_logging_block_keep_todays_writers():
    """A config saved before the logging block existed reads, once completed (as restore and
    the trainer complete every config), with today's default writers."""
    c = tiny_config("jsonl")
    del c["logging"]
    assert parse_writers(blocks.complete(c)) == ["jsonl", "tensorboard"]
