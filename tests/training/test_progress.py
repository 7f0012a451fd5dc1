"""The training log (`gpn_jax.training.progress`): its accounting with a hand-driven clock, its
lines, and a real run's stderr written to a file (no bar frames, one line per event)."""

import io
import re

import pytest

from gpn_jax.training import progress


class Clock:
    """A clock the test advances by hand."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _run_steps(log, clock, steps, checkpoint_every, step_s, save_s, eval_every=0, eval_s=0.0):
    """Drives `log` as the loop does: each step takes `step_s` (the first one also compiles,
    10 s), a checkpoint `save_s`, an evaluation `eval_s`; returns {step: row speed}."""
    rows = {}
    for step in range(1, steps + 1):
        clock.now += step_s + (10.0 if step == 1 else 0.0)
        log.settled(step)
        rows[step] = log.measure(step)
        if eval_every and step % eval_every == 0:
            with log.paused("evaluations"):
                clock.now += eval_s
        if step % checkpoint_every == 0:
            with log.paused("checkpoints"):
                clock.now += save_s
    return rows


def test_tokens_per_s_around_checkpoints_is_the_steps_own():
    """log_every=1, a checkpoint every 4 steps taking 50 steps' time: every row after the
    compiling one reads exactly the steps' rate, the checkpoints' time is reported apart."""
    clock = Clock()
    log = progress.TrainingLog(12, 0, 1000, bar=False, stream=io.StringIO(), clock=clock)
    rows = _run_steps(log, clock, 12, checkpoint_every=4, step_s=0.5, save_s=25.0)
    assert rows[1] == {"tokens_per_s": pytest.approx(1000 / 10.5, rel=1e-12)}  # compile included
    assert {s: r["tokens_per_s"] for s, r in rows.items() if s > 1} == {
        s: pytest.approx(2000.0, rel=1e-12) for s in range(2, 13)
    }
    totals = log.timer.totals
    assert totals["checkpoints"] == pytest.approx(75.0, rel=1e-12)
    assert totals["compile"] == pytest.approx(10.5, rel=1e-12)
    assert totals["steps"] == pytest.approx(11 * 0.5, rel=1e-12)


def test_a_window_of_several_steps_excludes_evaluations_and_gives_mfu():
    clock = Clock()
    log = progress.TrainingLog(
        8, 0, 100, bar=False, stream=io.StringIO(), clock=clock, flops_per_token=6.0,
        peak_flops=1200.0,
    )  # fmt: skip
    clock.now += 3.0  # the first step, compiling
    log.settled(1)
    assert log.measure(1) == {"tokens_per_s": pytest.approx(100 / 3.0, rel=1e-12)}  # no MFU
    assert log.compiling
    for step in range(2, 6):
        clock.now += 0.25
        log.settled(step)
        if step == 3:
            with log.paused("evaluations"):
                clock.now += 7.0
    speed = log.measure(5)
    assert not log.compiling
    assert speed["tokens_per_s"] == pytest.approx(4 * 100 / 1.0, rel=1e-12)
    assert speed["mfu"] == pytest.approx(400 * 6.0 / 1200.0, rel=1e-12)
    assert log.timer.totals["evaluations"] == pytest.approx(7.0, rel=1e-12)


def test_a_resumed_run_counts_from_its_first_step():
    clock = Clock()
    timer = progress.Throughput(10, start_step=40, clock=clock)
    clock.now += 5.0
    timer.settled(41)  # compiles
    clock.now += 2.0
    timer.settled(42)
    clock.now += 2.0
    timer.settled(43)
    assert timer.measure(43) == {"tokens_per_s": pytest.approx(2 * 10 / 4.0, rel=1e-12)}


def test_lines_are_one_per_event_with_eta():
    out, clock = io.StringIO(), Clock()
    log = progress.TrainingLog(10, 0, 64, bar=False, stream=out, clock=clock)
    rows = _run_steps(log, clock, 4, checkpoint_every=2, step_s=1.0, save_s=3.0)
    for step in (2, 4):
        log.row(step, {"loss": 5.0 - step / 10, **rows[step]})
    with log.paused("evaluations"):
        clock.now += 1.5
    log.heldout(4, 4.25, 70.1)
    log.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines == [
        "step 2/10  loss 4.8000  64 tokens/s  ETA 0:00:08",
        "step 4/10  loss 4.6000  64 tokens/s  ETA 0:00:06",
        "step 4/10  held-out loss 4.2500  PPL 70.10  (evaluated in 1.5 s)",
        "time: training steps 3.0 s, compile 11.0 s, checkpoints 6.0 s, evaluations 1.5 s",
    ]


def test_the_default_follows_the_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert progress.wants_bar(None, Tty()) and not progress.wants_bar(None, io.StringIO())
    assert progress.wants_bar(True, io.StringIO()) and not progress.wants_bar(False, Tty())
    with pytest.raises(ValueError, match="config.logging.progress_bar must be True, False"):
        progress.wants_bar("yes", io.StringIO())


def test_no_lines_off_the_lead_host():
    out = io.StringIO()
    log = progress.TrainingLog(4, 0, 8, bar=True, enabled=False, stream=out)
    log.row(1, {"loss": 1.0, "tokens_per_s": 3.0})
    log.heldout(1, 1.0, 2.7)
    log.close()
    assert out.getvalue() == ""


_STEP = re.compile(r"^step (\d+)/6  loss \d+\.\d{4}( .*)?$")


@pytest.mark.slow
def test_a_run_logging_to_a_file_writes_lines_not_frames(tmp_path, monkeypatch):
    """The trainer's stderr to a file: no carriage-return frames, one line per logged step,
    the held-out evaluations as they happen (the default: not a terminal, so lines). In this
    process: the log writes to `sys.stderr` as it finds it, here a file."""
    import sys

    from tests.helpers.training import tiny_config, train_on_one_device

    c = tiny_config(steps=6, checkpoint_every=3, eval_every=2, log_every=2)
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        monkeypatch.setattr(sys, "stderr", err)
        train_on_one_device(c, str(tmp_path / "run"))
        monkeypatch.undo()
    text = err_path.read_text()
    assert "\r" not in text
    ours = [ln for ln in text.splitlines() if ln.startswith(("step ", "time: "))]
    steps = [int(_STEP.match(ln).group(1)) for ln in ours if _STEP.match(ln)]
    assert steps == [2, 4, 6]
    evals = [ln for ln in ours if "held-out loss" in ln]
    assert [ln.split("/")[0] for ln in evals] == ["step 2", "step 4", "step 6"]
    assert all("tokens/s" in ln for ln in ours if _STEP.match(ln))
    assert ours[-1].startswith("time: training steps ")
