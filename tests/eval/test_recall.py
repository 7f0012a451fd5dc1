"""Associative recall: deterministic data, the `recall:` data spec, the accuracy eval."""

import math

import jax
import numpy as np
import pytest

from gpn_jax.data import recall
from gpn_jax.data.pipeline import build_data
from gpn_jax.data.spec import parse_spec
from gpn_jax.eval.recall import recall_accuracy
from tests.tolerance import f32_bound

SPEC = "pairs=4,keys=8,values=6,examples=64,heldout=16,seed=3"


def test_examples_are_deterministic_and_well_formed():
    spec = recall.parse_recall_params(SPEC)
    tokens, mask = recall.make_examples(spec, 50, seq_len=19)
    again, _ = recall.make_examples(spec, 50, seq_len=19)
    other, _ = recall.make_examples(recall.parse_recall_params(SPEC + ",seed=4"), 50, 19)
    heldout, _ = recall.heldout_examples(spec, 19, 50)
    np.testing.assert_array_equal(tokens, again)
    assert not np.array_equal(tokens, other) and not np.array_equal(tokens, heldout)
    assert tokens.shape == mask.shape == (50, 19) and tokens.max() < spec.vocab_needed
    Q = recall.num_queries(spec, 19)  # (19 - 8) // 2 = 5: the 4 keys, then one repeat
    assert Q == 5 and (mask.sum(1) == Q).all() and (tokens[:, -1] == recall.PAD).all()
    for row, m in zip(tokens, mask, strict=True):
        keys, values = row[0:8:2], row[1:8:2]
        assert len(set(keys)) == 4 and (keys >= 3).all() and (keys < 11).all()
        assert (values >= 11).all() and (values < 17).all()
        table = dict(zip(keys.tolist(), values.tolist(), strict=True))
        queries, answers = row[8:18:2], row[9:18:2]
        assert sorted(queries[:4].tolist()) == sorted(keys.tolist())  # all keys before repeats
        assert [table[q] for q in queries] == answers.tolist()
        assert m.nonzero()[0].tolist() == list(range(9, 18, 2))


@pytest.mark.parametrize(
    "params, match",
    [
        ("pairs=9,keys=8", "pairs <= keys"),
        ("pairs=x", "must be an integer"),
        ("colour=3", "bad recall parameter"),
        ("pairs", "bad recall parameter"),
        ("values=0", "positive integer"),
    ],
)
def test_bad_params(params, match):
    with pytest.raises(ValueError, match=match):
        recall.parse_recall_params(params)


def test_recall_data_spec_through_build_data():
    assert parse_spec("recall:" + SPEC).kind == "recall"
    data = build_data("recall:" + SPEC, vocab_size=20, seq_len=19, batch_size=4)
    spec = recall.parse_recall_params(SPEC)
    assert data.tokenizer is None and len(data.train_tokens) == 64 * 19
    train, _ = recall.make_examples(spec, 64, 19)
    np.testing.assert_array_equal(np.asarray(data.train_tokens).reshape(64, 19), train)
    heldout = np.concatenate(list(data.heldout_windows()))
    np.testing.assert_array_equal(heldout, recall.heldout_examples(spec, 19)[0])
    assert next(data.train).shape == (4, 19)  # windows are whole examples
    with pytest.raises(ValueError, match="needs vocab_size >= 17"):
        build_data("recall:" + SPEC, vocab_size=16, seq_len=19, batch_size=4)
    with pytest.raises(ValueError, match="no room for a query"):
        build_data("recall:" + SPEC, vocab_size=20, seq_len=9, batch_size=4)


def test_accuracy_counts_only_query_positions():
    spec = recall.parse_recall_params(SPEC)
    tokens, mask = recall.make_examples(spec, 10, 19)

    class Fake:  # right exactly where `right` is True, wrong (predicts pad) elsewhere
        def __init__(self, right):
            self.right = right

        def logits(self, params, x):
            return jax.nn.one_hot(jax.numpy.where(self.right, x, 0), 20) * 10.0, None

    r = recall_accuracy(Fake(mask), None, tokens, mask, batch_size=10)
    assert r["acc"] == 1.0 and r["answers"] == 50 and r["acc_by_query"] == [1.0] * 5
    # logits 10 on the answer, 0 on the 19 others: PPL exp(log(1 + 19 e^-10)) = 1 + 19 e^-10;
    # the float32 logsumexp of 20 terms of size <= 10 (x2)
    assert r["answer_ppl"] == pytest.approx(1 + 19 * math.exp(-10), rel=f32_bound(20, 2) * 10)
    assert r["examples"] == 10
    r = recall_accuracy(Fake(~mask), None, tokens, mask, batch_size=10)
    assert r["acc"] == 0.0 and r["answer_ppl"] > 1e3


def test_task_for_run_uses_the_runs_own_recall_data():
    from types import SimpleNamespace

    from experiments.configs import recall_gpn_m
    from gpn_jax.eval.recall import task_for_run

    c = recall_gpn_m.get_config()
    spec, seq_len = task_for_run(SimpleNamespace(config=c))
    assert "recall:" + spec.params() == c.data.source and seq_len == c.train.seq_len
    c.data.source, c.model.vocab_size = "embedded", 512  # a text run: the default probe
    spec, seq_len = task_for_run(SimpleNamespace(config=c))
    assert spec == recall.RecallSpec() and seq_len == 4 * spec.pairs


@pytest.mark.slow
def test_recall_run_trains_and_evaluates_through_the_normal_trainer(tmp_path):
    from experiments.configs import recall_gpn_m
    from gpn_jax.checkpoints.restore import load_run
    from gpn_jax.eval import run_evals
    from tests.helpers.training import train_on_one_device

    c = recall_gpn_m.get_config()
    c.data.source = "recall:pairs=4,keys=16,values=16,examples=256,heldout=64"
    c.train.update(dict(batch_size=8, seq_len=32, steps=3, eval_every=0, checkpoint_every=3))
    final = train_on_one_device(c, str(tmp_path))
    run = load_run(str(tmp_path))
    assert run.tokenizer is None
    r = run_evals(run, "recall,ppl,stream", stream_buckets="0,64,128", stream_window=32)
    assert r["recall"]["examples"] == 64 and r["recall"]["answers"] == 64 * 12
    # the same forward over the held-out windows, batched differently: 32 positions through
    # reductions no longer than d_ffn = 128 and the vocabulary's logsumexp (< 128), then the mean
    # over 64 x 32 tokens; exp turns the mean's absolute error (log ppl x relative) into the PPL's
    bound = math.log(final["heldout_ppl"]) * f32_bound(32 * 128 + 128 + 64 * 32, 1)
    assert r["ppl"]["ppl"] == pytest.approx(final["heldout_ppl"], rel=bound)
