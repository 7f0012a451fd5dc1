"""Ctrl-C (issue 83): while stepping, SIGINT is handled like SIGTERM (the loop stops at the next
step boundary and saves; the command then exits non-zero); anywhere else a command exits at
once with one line, no traceback."""

import os
import signal

import pytest

from gpn_jax.io import cli
from gpn_jax.training.loop import StopSignal


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_stepping_asks_the_loop_to_stop_and_says_which(signum):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    stop = StopSignal()
    try:
        os.kill(os.getpid(), signum)  # delivered to the main thread: the handler runs here
        assert stop.should_stop(1) and stop.name == signal.Signals(signum).name
    finally:
        stop.restore()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_ctrl_c_outside_the_steps_is_one_line_and_the_interrupted_status(capsys, monkeypatch):
    def hard_exit(code):
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", hard_exit)

    def compiling():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as e:
        cli.run_or_exit(compiling, prog="gpn-train")
    assert e.value.code == cli.INTERRUPTED == 130
    assert capsys.readouterr().err == "gpn-train: interrupted\n"
