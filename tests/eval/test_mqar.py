"""MQAR by the standard protocol: answer-only targets, fresh examples, the masked loss."""

import json
import os

import jax
import numpy as np
import pytest

from experiments.configs import recall_gpn_m
from gpn_jax.data import recall
from gpn_jax.data.pipeline import build_data
from gpn_jax.models import factory
from gpn_jax.training import train_step as ts
from tests.helpers.training import train_on_one_device
from tests.tolerance import f32_bound

SPEC = "pairs=4,keys=8,values=6,examples=0,heldout=16,seed=3"
V = 20
FAMILIES = {
    "gpn": dict(family="gpn", vocab_size=V, d_model=16, d_emb=8, d_ffn=32, n_heads=2, d_key=4,
                d_value=4, loss_chunk=8),
    "gdn": dict(family="gdn", vocab_size=V, d_model=16, n_layers=1, n_heads=2, d_key=4,
                d_value=4, d_ffn=32, chunk_size=8, loss_chunk=8),
    "transformer": dict(family="transformer", vocab_size=V, d_model=16, n_layers=1, n_heads=2,
                        d_ffn=32, max_seq_len=32, loss_chunk=8),
}  # fmt: skip


def test_targets_default_to_answers_and_all_keeps_the_lm_loss():
    spec = recall.parse_recall_params(SPEC)
    assert spec.targets == "answers" and spec.examples == 0
    mask = recall.loss_mask(spec, 19)
    assert mask.nonzero()[0].tolist() == list(range(9, 18, 2))  # the 5 answers
    assert recall.loss_mask(recall.parse_recall_params(SPEC + ",targets=all"), 19) is None
    assert recall.parse_recall_params(recall.parse_recall_params("targets=all").params()) == (
        recall.parse_recall_params("targets=all")
    )  # the spec string round-trips
    with pytest.raises(ValueError, match="targets must be one of"):
        recall.parse_recall_params("targets=keys")


def test_fresh_examples_every_step_deterministic_and_resumable():
    data = build_data("recall:" + SPEC, vocab_size=V, seq_len=19, batch_size=4, seed=7)
    assert isinstance(data.train, recall.FreshRecallIterator)
    np.testing.assert_array_equal(data.loss_mask, recall.answer_mask(data_spec(), 19))
    b0, b1 = next(data.train), next(data.train)
    assert b0.shape == (4, 19) and not np.array_equal(b0, b1)
    state = data.train.get_state()
    b2 = next(data.train)
    again = build_data("recall:" + SPEC, vocab_size=V, seq_len=19, batch_size=4, seed=7,
                       train_state=state)  # fmt: skip
    np.testing.assert_array_equal(next(again.train), b2)
    other = build_data("recall:" + SPEC, vocab_size=V, seq_len=19, batch_size=4, seed=8)
    assert not np.array_equal(next(other.train), b0)  # the training seed picks the stream
    # the layout of every fresh example is the task's: keys, values, queries, answers
    for row in b0:
        table = dict(zip(row[0:8:2].tolist(), row[1:8:2].tolist(), strict=True))
        assert [table[q] for q in row[8:18:2]] == row[9:18:2].tolist()


def data_spec():
    return recall.parse_recall_params(SPEC)


def test_pairs_that_do_not_fit_the_window_are_a_one_line_error():
    with pytest.raises(ValueError, match="no room for a query") as e:
        build_data("recall:pairs=8,keys=32", vocab_size=70, seq_len=16, batch_size=4)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_masked_loss_is_the_mean_ce_over_the_answers(family):
    model = factory.build_model(FAMILIES[family])
    params = model.init(jax.random.PRNGKey(0))
    tokens, mask = recall.make_examples(data_spec(), 3, 16)
    ce, _ = jax.jit(model.token_losses)(params, tokens)
    got = float(jax.jit(lambda p, x: model.loss(p, x, mask=mask[0]))(params, tokens)[0])
    # the same CEs from another program: 16 positions of reductions no longer than d_ffn = 32,
    # the V-way logsumexp, then the mean over the answers; x2
    bound = f32_bound(16 * 32 + V + 16, 2)
    assert got == pytest.approx(float(np.asarray(ce)[mask].mean()), rel=bound)


@pytest.mark.slow
def test_trainer_optimises_the_answer_loss(tmp_path):
    """The trainer's first logged loss is the answer-only CE of batch 0 at the initial params."""
    c = recall_gpn_m.get_config()
    c.data.source = "recall:pairs=4,keys=16,values=16,examples=0,heldout=64,seed=0"
    c.train.update(dict(batch_size=8, steps=1, warmup_steps=1, log_every=1, eval_every=0,
                        checkpoint_every=1, eval_batches=1))  # fmt: skip
    wd = str(tmp_path / "run")
    train_on_one_device(c, wd)
    with open(os.path.join(wd, "metrics.jsonl")) as f:
        first = next(r for r in map(json.loads, f) if "loss" in r)  # after the run_info record
    model = factory.build_model(c.model)
    init = jax.jit(lambda rng: ts.init_train_state(model, ts_optimizer(c, model), rng).params)
    params = init(jax.random.PRNGKey(c.seed))  # one program, not op by op
    data = build_data(c.data.source, vocab_size=c.model.vocab_size, seq_len=32, batch_size=8,
                      seed=c.seed)  # fmt: skip
    batch = next(data.train)
    ce, _ = jax.jit(model.token_losses)(params, batch)
    expected = float(np.asarray(ce)[:, data.loss_mask].mean())
    # sharded over 8 forced CPU devices vs one batch: windows of 32 positions through reductions
    # no longer than d_ffn = 128, the logsumexp over the recall vocabulary (< 128), then the mean
    # over the 8 x 32 answers' positions; x2
    bound = f32_bound(32 * 128 + 128 + 8 * 32, 2)
    assert first["loss"] == pytest.approx(expected, rel=bound)
    assert abs(first["loss"] - float(np.asarray(ce).mean())) > 1e-3  # not the all-position CE


def ts_optimizer(c, model):
    from gpn_jax.training.optimizer import make_optimizer

    return make_optimizer(c.train, model.weight_decay_mask)
