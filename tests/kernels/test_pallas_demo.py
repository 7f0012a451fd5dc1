"""The trainer with `model.kernels=pallas` (its kernels in Pallas's interpreter on this CPU):
a run trains and records its kernels. That the Pallas passes give XLA's losses and gradients is
tests/core/test_fused_window.py's (every kernel choice against autodiff), and 5 training steps
pallas against xla are the accelerator bench's check (tests/experiments/test_bench_accel.py)."""

import json
import math

import pytest

from tests.helpers.training import tiny_config, train_on_one_device


@pytest.mark.slow
def test_a_run_with_the_pallas_kernels_trains_and_records_them(tmp_path):
    config = tiny_config(steps=1, checkpoint_every=1, final_eval_batches=1)
    config.model.kernels = "pallas"
    train_on_one_device(config, str(tmp_path))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    info = next(r["run_info"] for r in rows if "run_info" in r)
    assert info["kernels"] == "pallas"
    assert info["kernel_checks"] == []  # the self-check runs on a GPU / TPU, not on a CPU
    (loss,) = [r["loss"] for r in rows if "loss" in r]
    assert math.isfinite(loss)
