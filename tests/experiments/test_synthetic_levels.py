"""What the synthetic suite's verdicts rest on: the levels a model reaches without the ability
under test, the "learnt" rule, disjoint splits, and the published-claims rows, including the
committed decisive result file's rows recomputed from its own cells."""

import json
import os
import re

import numpy as np
import pytest

from experiments.configs import synthetic_decisive, synthetic_quick, synthetic_tiny
from experiments.synthetic import levels, suite, verdicts
from gpn_jax.data import synthetic
from gpn_jax.data.synthetic import Examples
from gpn_jax.models import factory

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DECISIVE = os.path.join(ROOT, "experiments", "results", "synthetic_decisive.json")


def test_context_guess_on_a_hand_made_example():
    """Answers at t = 3 (one value read: 1) and t = 5 (two distinct values read: 1/2)."""
    x = np.array([[0, 10, 1, 10, 2, 11, 0]])
    y = np.array([[0, 0, 0, 10, 0, 11, 0]])
    m = y > 0
    assert levels.context_guess(Examples(x, y, m)) == pytest.approx((1.0 + 0.5) / 2)
    unseen = Examples(x, np.where(m, 12, 0), m)  # an answer never read scores 0 by guessing
    assert levels.context_guess(unseen) == 0.0


def test_context_guess_matches_a_simulated_guesser():
    """MQAR, 8 pairs over 32 values: a model that guesses among the values it has read."""
    ex = synthetic.generate("mqar", 400, 64, 65, 0, "test", pairs=8)
    rng = np.random.default_rng(0)
    hits = []
    for x, y, m in zip(*ex, strict=True):
        for t in np.flatnonzero(m):
            seen = np.unique(x[: t + 1][np.isin(x[: t + 1], np.unique(ex.labels[ex.mask]))])
            hits.append(rng.choice(seen) == y[t])
    hits = np.asarray(hits, float)
    sd = hits.std() / np.sqrt(len(hits) / 8)  # an example's 8 answers share one draw of values
    assert abs(hits.mean() - levels.context_guess(ex)) < 5 * sd
    assert levels.context_guess(ex) > 3 * synthetic.chance("mqar", 65, {"pairs": 8})


def test_state_level_counts_the_directly_seen_positions():
    size = factory.Width(width=32, vocab=16, max_len=64)
    gdn = factory.at_width("gdn", size) | {"n_layers": 2, "conv_size": 4}
    assert levels.direct_positions(gdn) == 7  # two stacked width-4 convolutions: 1 + 2 x 3
    assert levels.direct_positions(gdn | {"n_layers": 1}) == 4
    assert levels.direct_positions(factory.at_width("transformer", size)) == 1
    assert levels.state_level(0.5, 40, 4) == pytest.approx(0.55)  # (4 + 36 / 2) / 40
    assert levels.state_level(0.5, 16, 4) == pytest.approx(0.625)
    assert levels.state_level(0.5, 3, 7) == 1.0


def test_learnt_needs_the_margin_the_seeds_support():
    assert levels.learnt([0.70, 0.71, 0.69], 0.6)
    assert not levels.learnt([0.63, 0.64, 0.65], 0.6)  # within MIN_MARGIN of the level
    assert not levels.learnt([1.0, 0.55, 0.56], 0.55)  # one seed: the spread does not support it
    # three seeds: the one-sided 95 % t bound, 2.920 sd / sqrt(3), here 0.169
    accs = [0.40, 0.50, 0.60]
    assert levels.margin(accs) == pytest.approx(2.920 * 0.1 / np.sqrt(3))
    assert levels.learnt(accs, 0.33) and not levels.learnt(accs, 0.36)
    assert levels.learnt(accs, 0.34)  # every seed clears 0.34 by 0.05: unanimous
    assert levels.learnt([0.33, 0.32, 1.0], 0.23) and not levels.learnt([0.30, 0.32, 1.0], 0.26)
    assert not levels.learnt([], 0.0) and levels.margin([0.9]) == levels.MIN_MARGIN


def test_onset_is_the_first_step_the_chosen_runs_clear_the_level():
    curve = [[100, [0.1, 0.9, 0.2, 0.2]], [200, [0.1, 0.9, 0.9, 0.9]], [300, [0.9, 0.9, 0.9, 0.9]]]
    assert levels.onset(curve, slice(2, 4), 0.5) == 200  # runs 2 and 3: the chosen rate's
    assert levels.onset(curve, slice(0, 2), 0.5) == 300
    assert levels.onset(curve, slice(0, 2), 0.95) is None


def test_held_out_splits_never_repeat_a_training_example():
    """Quick's parity at length 16 draws about a fifth of its test set from the training set;
    the suite replaces those rows, so no validation or test input occurs in training."""
    c = synthetic_quick.get_config()
    rows = lambda ex: {r.tobytes() for r in ex.inputs}
    train = rows(suite.task_examples(c, "parity", "train", c.tasks.parity.n_train))
    raw = suite._generate(c, "parity", "test", c.n_test, 16)
    assert len(rows(raw) & train) > c.n_test // 10  # the overlap is real
    valid = suite.task_examples(c, "parity", "valid", c.n_valid)
    test = suite.task_examples(c, "parity", "test", c.n_test)
    assert len(test.inputs) == c.n_test and not (rows(test) & (train | rows(valid)))
    assert not rows(valid) & train


def test_a_config_task_whose_chance_is_one_stops_the_suite_before_training():
    c = synthetic_tiny.get_config()
    c.tasks.selective_copying.vocab = 3
    with pytest.raises(ValueError, match="config task selective_copying: .*chance would be 1.0"):
        suite.task_list(c)


def _cell(task, family, test, beyond=None, level=0.5, chance=0.5, kind=None):
    return {"task": task, "kind": kind or task, "family": family, "model": family,
            "test_acc": test, "learnt": levels.learnt(test, level), "level": level,
            "chance": chance, "beyond_acc": beyond or [],
            "learnt_beyond": levels.learnt(beyond, chance) if beyond else None,
            "length_acc": {"40": test, "320": beyond or test}, "settings_seq_len": 40,
            "onset_step": None}  # fmt: skip


def test_published_rows_follow_the_cells():
    cells = [_cell("parity", "gdn_neg", [1.0, 1.0], beyond=[0.97, 0.99]),
             _cell("parity", "gdn", [0.9, 0.92], beyond=[0.52, 0.51]),
             _cell("mqar_4", "transformer", [0.99, 1.0], level=0.26, chance=0.03, kind="mqar")]  # fmt: skip
    rows = {r["claim"][:20]: r["agrees"] for r in verdicts.published_rows(cells)}
    assert list(rows.values()) == ["yes", "yes", "yes"] and len(rows) == 3
    cells[1] = _cell("parity", "gdn", [1.0, 1.0], beyond=[0.95, 0.96])  # [0, 1] extrapolates
    assert [r["agrees"] for r in verdicts.published_rows(cells)] == ["yes", "no", "yes"]
    s5 = [_cell("s5", f, [0.03, 0.03], beyond=[0.008, 0.008], level=0.03, chance=0.008)
          for f in ("transformer", "gpn_m")]  # fmt: skip
    untested = verdicts.published_rows(cells + s5)[-1]
    assert (
        untested["agrees"] == "untested"
        and "no family learnt s5 even at T = 40" in untested["ours"]
    )
    s5[1] = _cell("s5", "gpn_m", [0.9, 0.92], beyond=[0.9, 0.9], level=0.03, chance=0.008)
    assert verdicts.published_rows(cells + s5)[-1]["agrees"] == "yes"
    level = verdicts.level_rows(cells)
    assert [r["measured"] for r in level[:2]] == ["T = 40", "positions 41–320 of T = 320"]
    assert level[1]["gdn_neg"].endswith(verdicts.LEARNT) and level[1]["gdn"] == "0.955 ± 0.007 ✓"


@pytest.mark.skipif(not os.path.exists(DECISIVE), reason="no committed decisive result yet")
def test_the_committed_decisive_rows_are_what_its_cells_give():
    """Every rendered verdict of the decisive table (levels, onsets, published claims) is
    recomputed from the result file's own cells: a claim the numbers stop supporting fails."""
    with open(DECISIVE, encoding="utf-8") as f:
        data = json.load(f)
    c = synthetic_decisive.get_config()
    cells = verdicts.annotate(c, data["cells"])
    assert data["level_rows"] == verdicts.level_rows(cells)
    assert data["onset_rows"] == verdicts.onset_rows(cells, c.steps)
    assert data["published"] == verdicts.published_rows(cells)
    for x in cells:  # each verdict from the cell's own accuracies
        assert x["learnt"] == levels.learnt(x["test_acc"], x["level"])
        assert len(x["test_acc"]) >= 2 and len(x["valid_curve"]) * c.eval_every >= c.steps
    assert len(data["published"]) >= 4
    # the page's account of a disagreeing "solves MQAR" row: some seed of that family did
    # solve an MQAR setting (the others had not got there yet), and the page says so
    with open(os.path.join(ROOT, "docs", "results.md"), encoding="utf-8") as f:
        page = f.read()
    for row in (r for r in data["published"] if "MQAR" in r["claim"] and r["agrees"] == "no"):
        solved = [int(n) for n in re.findall(r"(\d+) of \d+ seeds", row["ours"])]
        assert max(solved) >= 1, row
        assert "had not got there" in page
    # "most cells of the decisive table start learning after step 200" (the pipeline checks)
    onsets = [r[f] for r in data["onset_rows"] for f in verdicts.COLUMNS]
    late = [o for o in onsets if o == "never" or int(o.replace(",", "")) > 200]
    assert "start learning after step 200" in page and len(late) > len(onsets) / 2
