"""Ctrl-C (issue 83): while stepping, SIGINT is handled like SIGTERM (the loop stops at the next
step boundary and saves; the command then exits non-zero); anywhere else a command exits at
once with one line, no traceback."""

import os
import signal
import threading

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


def test_ctrl_c_in_a_commands_compile_block_exits_from_a_thread(monkeypatch):
    """`cli.interrupt_exits_at_once` (the first step's compile): the signal's wakeup fd wakes a
    thread that exits, whatever the main thread is doing (in XLA's compile, native code,
    Python's handler would run only once it returned). The handler in place stays (here a
    no-op, as the loop's StopSignal only sets a flag)."""
    calls, done = [], threading.Event()

    def interrupted(prog):
        calls.append((prog, threading.current_thread() is threading.main_thread()))
        done.set()

    monkeypatch.setattr(cli, "_interrupted", interrupted)

    def compiling():
        with cli.interrupt_exits_at_once():
            os.kill(os.getpid(), signal.SIGINT)
            assert done.wait(60)

    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    previous = signal.signal(signal.SIGINT, lambda *_: None)
    try:
        cli.run_or_exit(compiling, prog="gpn-train")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert calls == [("gpn-train", False)]
    assert signal.set_wakeup_fd(wakeup) == wakeup  # given back
