"""The synthetic suite's harness (`experiments.synthetic`): what is scored, the label
alignment (an oracle that reads only the inputs scores 1.0, a constant predictor chance),
the leak check, seeding, resuming and the result files. Harness, not models."""

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import synthetic_tiny
from experiments.synthetic import report, runner, suite
from gpn_jax.data import synthetic
from gpn_jax.data.synthetic import memorisation, state
from gpn_jax.io import lock as workdir_lock
from gpn_jax.io.errors import CheckpointError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_score_reads_answer_positions_only():
    ex = synthetic.generate("mqar", 50, 32, 33, 0, "test", pairs=4)
    x, y, m = runner.model_window(ex, 40)
    right_off_mask = np.where(m, y + 1, y)  # right everywhere except the answers
    assert runner.hits(right_off_mask, y, m).sum() == 0
    wrong_off_mask = np.where(m, y, 7)  # right on the answers, garbage elsewhere
    np.testing.assert_array_equal(runner.hits(wrong_off_mask, y, m), m.sum(0))


def test_labels_never_enter_the_window():
    """The model's window is built from the inputs alone: other labels, the same window."""
    ex = synthetic.generate("parity", 20, 16, 2, 0, "train")
    x, _, _ = runner.model_window(ex, 20)
    flipped = ex._replace(labels=1 - ex.labels)
    assert (runner.model_window(flipped, 20)[0] == x).all()
    assert (x[:, 16:] == runner.PAD).all()


class _Oracle:
    """A stand-in for `runner.Programs` whose 'model' computes the answer from the window's
    inputs up to each position (never from the labels); `shift` misaligns it by positions."""

    def __init__(self, answer, shift=0):
        self.answer, self.shift = answer, shift

    def predict(self, params, x):
        del params
        inputs = np.asarray(x)[:, :-1] - runner.RESERVED  # window position t + 1 reads x[:t+1]
        pred = self.answer(inputs) + runner.RESERVED
        pred = np.roll(pred, self.shift, axis=1)
        return jnp.asarray(np.stack([pred, pred]))  # two "runs"


def _s5_running(x):
    table = state.s5_table()
    out = np.zeros_like(x)
    acc = x[:, 0]
    out[:, 0] = acc
    for t in range(1, x.shape[1]):
        acc = table[acc, np.clip(x[:, t], 0, 119)]
        out[:, t] = acc
    return out


ORACLES = {
    "parity": (2, lambda x: np.cumsum(np.clip(x, 0, 1), 1) % 2),
    "modular_addition": (5, lambda x: np.cumsum(np.clip(x, 0, 4), 1) % 5),
    "s5": (120, _s5_running),
    "memorisation": (64, lambda x: np.roll(memorisation.key_value_map(64, 0)[np.clip(x, 0, 30)], 1, 1)),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ORACLES))
def test_oracle_scores_one_and_misaligned_oracle_chance(name):
    vocab, answer = ORACLES[name]
    ex = synthetic.generate(name, 200, 32, vocab, 0, "test")
    params = {"w": jnp.zeros((2, 1))}  # two runs
    acc = runner.accuracy(_Oracle(answer), params, ex, window=40, batch=64)
    assert acc.tolist() == [1.0, 1.0]
    off = runner.accuracy(_Oracle(answer, shift=1), params, ex, window=40, batch=64)
    assert off.max() < 2.5 * synthetic.chance(name, vocab, {}) + 0.02


CHANCE_TASKS = [
    ("in_context_recall", 64, 16, {}),
    ("noisy_recall", 64, 32, {"frac_noise": 0.2, "noise_vocab": 16}),
    ("selective_copying", 64, 16, {"n_copy": 8}),
    ("compression", 32, 16, {}),
    ("memorisation", 32, 64, {}),
    ("mqar", 64, 33, {"pairs": 8}),
    ("parity", 32, 2, {}),
    ("modular_addition", 32, 5, {}),
    ("s5", 32, 120, {}),
]


@pytest.mark.parametrize("name,T,vocab,params", CHANCE_TASKS)
def test_oracle_one_and_constant_predictor_chance(name, T, vocab, params):
    """Emitting the answer key scores exactly 1; every constant prediction of an answer symbol
    scores the stated chance, within 5 binomial standard deviations."""
    ex = synthetic.generate(name, 2000, T, vocab, 0, "test", **params)
    _, y, m = runner.model_window(ex, ex.inputs.shape[1])
    answers = int(m.sum())
    assert runner.hits(y, y, m).sum() == answers
    chance = synthetic.chance(name, vocab, params)
    symbols = np.unique(y[m])
    assert len(symbols) == round(1 / chance)
    for s in symbols:
        correct = runner.hits(np.full_like(y, s), y, m).sum()
        # an example's answers may repeat one draw (MQAR asks each key 3 times): the spread
        # is measured over examples, the independent units
        per_example = ((y == s) & m).sum(1) - chance * m.sum(1)
        sd = np.sqrt(len(y) * per_example.var()) / answers
        assert abs(correct / answers - chance) < 5 * sd + 1e-9, (name, s)


def test_leaky_state_format_stops_the_suite(monkeypatch):
    """A parity format that feeds the running parity back as the next input is refused."""
    c = synthetic_tiny.get_config()
    honest = synthetic.TASKS["parity"]

    def leaky(n, seq_len, vocab, seed, split):  # input t encodes (x_t, parity before t)
        ex = honest[0](n, seq_len, vocab, seed, split)
        before = np.pad(ex.labels[:, :-1], ((0, 0), (1, 0)))
        return ex._replace(inputs=ex.inputs + 2 * before)

    assert suite.leak_check(c, "parity") < 0.6
    monkeypatch.setitem(synthetic.TASKS, "parity", (leaky, honest[1]))
    with pytest.raises(ValueError, match="leaks the state into the input stream"):
        suite.leak_check(c, "parity")


def _two_task_config():
    c = synthetic_tiny.get_config()
    c.families = "transformer"
    c.tasks = {k: c.tasks[k] for k in ("parity", "mqar")}
    return c


def test_each_task_trains_at_its_own_length_unless_a_window_is_set():
    c = _two_task_config()
    fields = {"family": "transformer"}
    lengths = {name: suite.example_len(c, name) for name in c.tasks}
    assert lengths["parity"] != lengths["mqar"]
    for name, length in lengths.items():
        assert suite.task_window(c, name) == length
        assert suite.settings(c, name, "transformer", fields)["window"] == length
    c.window = 32
    assert {suite.settings(c, n, "transformer", fields)["window"] for n in c.tasks} == {32}
    assert suite.shapes(c) == (runner.RESERVED + 17, 32)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """The tiny config on two tasks and one family, in two workdirs, plus a resumed rerun."""
    c = _two_task_config()
    dirs = [str(tmp_path_factory.mktemp(f"suite{i}")) for i in range(2)]
    cells = [suite.run_suite(c, d, log=lambda s: None) for d in dirs]
    lines = []
    again = suite.run_suite(c, dirs[0], log=lines.append)
    return c, dirs, cells, again, lines


def test_same_seed_same_result_and_resume(two_runs):
    c, dirs, (a, b), again, lines = two_runs
    strip = lambda cells: [{k: v for k, v in x.items() if not k.endswith("_s")} for x in cells]
    assert strip(a) == strip(b)
    assert strip(again) == strip(a)
    assert not any("training" in s for s in lines) and len(lines) == 2
    parity = next(x for x in a if x["task"] == "parity")
    assert sorted(parity["length_acc"]) == ["24", "8"]
    assert len(parity["test_acc"]) == len(c.seeds)
    assert parity["best_lr"] in c.learning_rates and parity["leak_score"] < 0.6


def test_other_settings_in_a_finished_cell_are_an_error(two_runs):
    c, dirs, *_ = two_runs
    c = c.copy_and_resolve_references()
    c.steps = c.steps + 1
    with pytest.raises(ValueError, match=r"__transformer\.json: made with other settings"):
        suite.run_suite(c, dirs[1], log=lambda s: None)


def test_a_second_suite_on_the_same_workdir_is_refused(two_runs):
    c, dirs, *_ = two_runs
    held = workdir_lock.acquire(dirs[1])  # as another process running the suite there
    try:
        with pytest.raises(CheckpointError, match=r"is in use by another trainer"):
            suite.run_suite(c, dirs[1], log=lambda s: None)
    finally:
        held.release()
    assert len(suite.run_suite(c, dirs[1], log=lambda s: None)) == 2  # free again


def test_outputs(two_runs, tmp_path):
    c, dirs, (cells, _), *_ = two_runs
    out = report.write_all(c, str(tmp_path), cells, 1.0)
    rows = {r["task"]: r for r in out["rows"]}
    assert set(rows) == {"parity", "mqar"} and rows["parity"]["gpn_m"] == "–"
    assert rows["parity"]["transformer"].startswith(f"{cells[1]['test_acc_mean']:.3f} ±")
    assert json.loads((tmp_path / "synthetic_tiny.json").read_text())["rows"] == out["rows"]
    bench = json.loads((tmp_path / "synthetic_tiny_bench.json").read_text())
    assert [r["wall_s"] for r in bench["cells"]] == [x["wall_s"] for x in cells]
    assert bench["rows"] == [{"model": "Transformer++", "cells": 2, "first_cell_s": cells[0]["wall_s"],
                              "wall_s": round(sum(x["wall_s"] for x in cells), 1),
                              "first_step_s": cells[0]["first_step_s"]}]  # fmt: skip
    assert (tmp_path / "synthetic_tiny_length.png").stat().st_size > 1000
    for plot in ("positions", "curves"):  # per position past the training length; validation
        assert (tmp_path / f"synthetic_tiny_{plot}.png").stat().st_size > 1000
    parity = next(r for r in out["level_rows"] if r["measured"].startswith("positions"))
    assert parity["task"] == "parity" and parity["measured"] == "positions 9–24 of T = 24"
    assert [r["task"] for r in out["onset_rows"]] == ["mqar", "parity"]


@pytest.mark.slow
def test_command_runs_the_tiny_suite(tmp_path):
    """The one command, end to end: every task of the tiny config, two families."""
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    cmd = [sys.executable, "-m", "experiments.synthetic",
           "--config=experiments/configs/synthetic_tiny.py", f"--workdir={tmp_path}"]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads((tmp_path / "synthetic_tiny.json").read_text())
    assert len(out["rows"]) == 10 and len(out["cells"]) == 20
    assert len(out["level_rows"]) == 13  # ten tasks, three of them also past their length
    parity = next(x for x in out["cells"] if x["task"] == "parity")
    assert len(parity["position_acc"]) == 24 and len(parity["valid_curve"]) == 2
    assert "[20/20]" in done.stdout
