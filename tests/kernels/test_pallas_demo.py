"""The main job with `model.kernels=pallas` (its kernels in Pallas's interpreter on this CPU)
logs the same five losses as with `model.kernels=xla`, and each run records its kernels. Both
run at batch 4 (the demo's 16 only multiplies the interpreter's work)."""

import json

import pytest

from tests.helpers.cli import run_train
from tests.tolerance import assert_rel_close, f32_bound

DEMO = "experiments/configs/demo.py"
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
        # the pallas run reads the tokenizer the xla run trained (the same tokens, one
        # SentencePiece training fewer)
        tokenizer = [f"--config.data.tokenizer_path={tmp_path / 'xla' / 'tokenizer.model'}"]
        proc = run_train(
            tmp_path / kernels,
            f"--config.train.steps={STEPS}",
            "--config.train.batch_size=4",
            "--config.train.log_every=1",
            "--config.train.eval_every=0",
            "--config.train.final_eval_batches=1",  # the training losses are compared, not it
            f"--config.model.kernels={kernels}",
            *(tokenizer if kernels == "pallas" else []),
            config=DEMO,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs[kernels] = _losses_and_kernels(tmp_path / kernels)
    (xla, xla_name), (pallas, pallas_name) = runs["xla"], runs["pallas"]
    assert (xla_name, pallas_name) == ("xla", "pallas")
    assert len(xla) == len(pallas) == STEPS
    # Only the memory's passes differ: over T = 128 steps, contractions of at most
    # d_value = 64 terms rounded in another order (the rest is the same XLA program); x4 for
    # what the optimiser carries from one step's gradients into the next step's loss.
    assert_rel_close(pallas, xla, f32_bound(128 * 64, 4), "losses")
