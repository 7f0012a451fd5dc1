"""The main job with `model.kernels=pallas` (its kernels in Pallas's interpreter on this CPU)
logs the same five losses as with `model.kernels=xla`, and each run records its kernels. Both
run at batch 4 (the demo's 16 only multiplies the interpreter's work)."""

import json

import pytest

from experiments.configs import demo
from tests.helpers.training import train_on_one_device
from tests.tolerance import assert_rel_close, f32_bound

STEPS = 5


def _losses_and_kernels(workdir) -> tuple[list[float], str]:
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    info = next(r["run_info"] for r in rows if "run_info" in r)
    losses = [r["loss"] for r in rows if "loss" in r]
    assert info["kernel_checks"] == []  # the self-check runs on a GPU / TPU, not on a CPU
    return losses, info["kernels"]


@pytest.mark.slow
def test_five_demo_steps_log_the_same_losses_with_pallas_as_with_xla(tmp_path):
    runs = {}
    for kernels in ("xla", "pallas"):
        config = demo.get_config()
        config.train.update(dict(steps=STEPS, batch_size=4, log_every=1, eval_every=0))
        config.train.final_eval_batches = 1  # the training losses are compared, not it
        config.model.kernels = kernels
        train_on_one_device(config, str(tmp_path / kernels))
        runs[kernels] = _losses_and_kernels(tmp_path / kernels)
    (xla, xla_name), (pallas, pallas_name) = runs["xla"], runs["pallas"]
    assert (xla_name, pallas_name) == ("xla", "pallas")
    assert len(xla) == len(pallas) == STEPS
    # Only the memory's passes differ: over T = 128 steps, contractions of at most
    # d_value = 64 terms rounded in another order (the rest is the same XLA program); x4 for
    # what the optimiser carries from one step's gradients into the next step's loss.
    assert_rel_close(pallas, xla, f32_bound(128 * 64, 4), "losses")
