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


def test_a_step_is_timed_to_when_it_finished_not_when_it_was_read():
    """Metrics read one step late, two of them back to back at a checkpoint: each window ends
    where its step finished (`at`), so the second is not a window of no time."""
    clock = Clock()
    timer = progress.Throughput(10, start_step=0, clock=clock)
    clock.now += 5.0
    timer.settled(1)  # compiles
    done = {}
    for step in (2, 3):
        clock.now += 2.0
        done[step] = clock.now
    clock.now += 0.5  # then both are read, late
    rates = []
    for step in (2, 3):
        timer.settled(step, done[step])
        rates.append(timer.measure(step, done[step]))
    assert rates == [{"tokens_per_s": pytest.approx(10 / 2.0, rel=1e-12)}] * 2


def test_a_sharded_run_reports_each_steps_own_rate_at_a_checkpoint_and_a_stop(
    tmp_path, monkeypatch
):
    """Issue 84: on a sharded (one step late) run whose steps finish inside their call, as on
    XLA:CPU, the row of a checkpoint step and of the step a SIGTERM stopped at read tens of
    times the real tokens/s (and the row after a checkpoint half). Here each step advances the
    log's clock by 1 s inside its call, and nothing else does: every row after the compiling
    one must read one step's tokens per second."""
    import dataclasses
    import json
    import os
    import signal

    import jax

    from gpn_jax.training import loop, setup
    from tests.helpers.training import tiny_config

    clock, calls = Clock(), []
    build = setup.build

    def build_timed(*args, **kwargs):
        run = build(*args, **kwargs)

        def step(state, batch):
            out = jax.block_until_ready(run.train_step(state, batch))  # finished in the call
            clock.now += 1.0
            calls.append(1)
            if len(calls) == 6:
                os.kill(os.getpid(), signal.SIGTERM)  # the loop stops after this step
            return out

        return dataclasses.replace(run, train_step=step)

    training_log = loop._training_log

    def log_on_the_clock(run, step):
        log = training_log(run, step)
        log.timer = progress.Throughput(run.tokens_per_step, step, clock)
        return log

    monkeypatch.setattr(setup, "build", build_timed)
    monkeypatch.setattr(loop, "_training_log", log_on_the_clock)
    config = tiny_config(steps=8, checkpoint_every=4)  # the tests' 8 devices: data=8, sharded
    workdir = tmp_path / "run"
    assert loop.train_and_evaluate(config, str(workdir)) == {"stopped_at": 6, "signal": "SIGTERM"}
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    rates = {r["step"]: r["tokens_per_s"] for r in rows if "tokens_per_s" in r}
    per_step = config.train.batch_size * config.train.seq_len
    assert sorted(rates) == [1, 2, 3, 4, 5, 6]
    assert {s: r for s, r in rates.items() if s > 1} == {
        s: pytest.approx(per_step / 1.0, rel=1e-9) for s in range(2, 7)
    }


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


_STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")
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
    ours = [_STAMP.sub("", ln) for ln in text.splitlines() if _STAMP.match(ln)]  # each stamped
    assert ours[0].startswith("gpn model, ") and "| workdir " in ours[0]  # the run's first line
    assert "| data embedded |" in ours[0] and "| mesh {'data': 1, " in ours[0]
    assert "step 1: compiling the training step" in ours
    assert any(ln.startswith("compiled the training step in ") for ln in ours)
    ours = [ln for ln in ours if ln.startswith(("step ", "time: ")) and "compiling" not in ln]
    steps = [int(_STEP.match(ln).group(1)) for ln in ours if _STEP.match(ln)]
    assert steps == [2, 4, 6]
    evals = [ln for ln in ours if "held-out loss" in ln]
    assert [ln.split("/")[0] for ln in evals] == ["step 2", "step 4", "step 6"]
    assert all("tokens/s" in ln for ln in ours if _STEP.match(ln))
    assert ours[-1].startswith("time: training steps ")
