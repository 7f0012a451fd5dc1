"""Continuing a run of the paper's trainer: `--config.train.init_from=paper:<checkpoint.pkl>`."""

import json
import os
import pickle
import shutil

import chex
import jax
import numpy as np
import optax
import pytest

from gpn_jax.checkpoints.paper_pickle import from_paper_params, to_paper_params
from gpn_jax.data import pipeline
from gpn_jax.data.windows import WindowIterator
from gpn_jax.models import factory
from gpn_jax.training import init_from
from tests.helpers.cli import assert_one_line_error, run_train
from tests.helpers.training import final_state, tiny_config, train_on_one_device
from tests.tolerance import assert_rel_close, f32_bound, rel_err

PAPER_STEP = 3  # the paper run's step and data position (grad_accum 1: one micro-batch a step)
N_TOKENS = 4096  # 128 windows of 32: 96 train (12 steps of 8), 32 held out


def paper_optimizer(config, paper_params):
    """The paper trainer's optax chain, built its way: on its own flat, paper-named parameter
    dict, decay mask = matrices except A_log / dt_bias, schedule decaying over total_steps."""
    t = config.train
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, t.learning_rate, t.warmup_steps, t.steps, t.learning_rate * t.min_lr_ratio
    )
    mask = {
        k: v.ndim >= 2 and "A_log" not in k and "dt_bias" not in k for k, v in paper_params.items()
    }
    return optax.chain(
        optax.clip_by_global_norm(t.grad_clip),
        optax.adamw(schedule, b1=t.b1, b2=t.b2, weight_decay=t.weight_decay, mask=mask),
    )


def paper_run(tmp_path, config):
    """A checkpoint as the paper trainer writes it after PAPER_STEP steps, and its bin: data."""
    data = tmp_path / "paper_data"
    data.mkdir()
    tokens = np.random.default_rng(0).integers(0, 512, N_TOKENS, dtype=np.uint32)
    tokens.tofile(data / "data_0000.bin")
    model = factory.build_model(config.model)
    params = to_paper_params(model.init(jax.random.PRNGKey(1)))
    opt = paper_optimizer(config, params)
    opt_state = opt.init(params)
    apply = jitted_update(opt)
    for k in range(PAPER_STEP):
        keys = jax.random.split(jax.random.PRNGKey(10 + k), len(params))
        grads = {
            n: 0.1 * jax.random.normal(r, p.shape)
            for r, (n, p) in zip(keys, params.items(), strict=True)
        }
        params, opt_state = apply(grads, opt_state, params)
    ckpt = {
        "step": PAPER_STEP,
        "data_position": PAPER_STEP,
        "params": jax.tree.map(np.asarray, params),
        "opt_state": jax.tree.map(np.asarray, opt_state),
    }
    (tmp_path / "paper_ckpt").mkdir()
    with open(tmp_path / "paper_ckpt" / "checkpoint.pkl", "wb") as f:
        pickle.dump(ckpt, f)
    return str(tmp_path / "paper_ckpt" / "checkpoint.pkl"), str(data), tokens, ckpt


@pytest.fixture(scope="module")
def paper(tmp_path_factory):
    """`paper_run` for the default continued config (steps PAPER_STEP + 1), made once: (pkl,
    data, tokens, ckpt). Tests that change the checkpoint change a copy (`own_pickle`)."""
    return paper_run(tmp_path_factory.mktemp("paper"), continued_config("", ""))


def own_pickle(paper, tmp_path):
    """A copy of the shared paper checkpoint this test may rewrite: (pkl, data, tokens, ckpt)."""
    pkl, data, tokens, ckpt = paper
    (tmp_path / "paper_ckpt").mkdir()
    own = str(tmp_path / "paper_ckpt" / "checkpoint.pkl")
    shutil.copyfile(pkl, own)
    return own, data, tokens, dict(ckpt)


def jitted_update(opt):
    """(grads, opt_state, params) -> (params, opt_state) after one update by `opt`; jitted,
    since eager optax over ~40 leaves compiles hundreds of tiny programs."""

    def apply(grads, opt_state, params):
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return jax.jit(apply)


def continued_config(pkl, data, **train):
    c = tiny_config(**{"warmup_steps": 2, **train})  # the paper decays over steps - warmup > 0
    c.data.source, c.data.heldout_fraction = f"bin:{data}", 0.25
    c.train.init_from = f"paper:{pkl}"
    c.train.async_checkpoints = False
    return c


def test_the_first_step_after_the_hand_over_is_the_papers_step(tmp_path, paper):
    pkl, data, tokens, ckpt = paper
    config = continued_config(pkl, data, steps=PAPER_STEP + 1)
    train_on_one_device(config, str(tmp_path / "run"))

    # Independently: the paper's next micro-batch (windows kB .. kB+B-1 of its bin: shards,
    # in order), our model's loss and gradient there, and its optax chain's update.
    b, t = config.train.batch_size, config.train.seq_len
    start = ckpt["data_position"] * b * t
    batch = tokens[start : start + b * t].reshape(b, t).astype(np.int32)
    model = factory.build_model(config.model)
    ours = from_paper_params(ckpt["params"])
    loss, grads = jax.jit(jax.value_and_grad(lambda p: model.loss(p, batch)[0]))(ours)
    opt = paper_optimizer(config, ckpt["params"])
    applied, _ = jitted_update(opt)(to_paper_params(grads), ckpt["opt_state"], ckpt["params"])
    expected = from_paper_params(jax.device_get(applied))

    rows = [json.loads(r) for r in open(os.path.join(tmp_path / "run", "metrics.jsonl"))]
    rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in rows] == [PAPER_STEP + 1]  # the step counter continues
    step, state, data_state, _ = final_state(str(tmp_path / "run"), config)
    assert step == int(state.step) == PAPER_STEP + 1
    assert (data_state["layout"], data_state["next_index"]) == ("sequential", PAPER_STEP + 1)
    # Same state, same batch, same ops; the run's gradient is all-reduced over 8 devices, so
    # its sums run in another order. The longest reduction is the gradient's sum over the
    # B*T = 256 tokens after the vocab's 512-way logsumexp; Adam's update divides by the
    # gradient's own scale, so it keeps the gradient's relative error: x4 margin for the
    # moments' chain. A wrong recipe moves the update by O(1e-2) or more (no weight decay,
    # decay on every leaf, a schedule one step off).
    bound = f32_bound(b * t + config.model.vocab_size, 4)
    assert rel_err(rows[0]["loss"], float(loss)) <= bound
    assert_rel_close(jax.device_get(state.params), expected, bound, "params after the update")
    taken = jax.tree.map(np.subtract, jax.device_get(state.params), ours)
    assert_rel_close(taken, jax.tree.map(np.subtract, expected, ours), bound, "the update")


@pytest.mark.slow
def test_a_preempted_continued_run_resumes_from_its_own_checkpoint(tmp_path, capsys, paper):
    pkl, data, _, _ = paper
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    end = PAPER_STEP + 3
    # A preempted run is rerun with the same command; its first part stops early here, so both
    # parts get one LR schedule (warm-up past the end: decay over max(steps, warmup + 1)).
    same = dict(warmup_steps=end + 5)
    train_on_one_device(continued_config(pkl, data, steps=end, **same), straight)
    train_on_one_device(continued_config(pkl, data, steps=PAPER_STEP + 1, **same), resumed)
    capsys.readouterr()
    train_on_one_device(continued_config(pkl, data, steps=end, **same), resumed)
    out = capsys.readouterr()
    assert f"Resuming from checkpoint step {PAPER_STEP + 1}" in out.err  # with the progress
    assert f"train.init_from=paper:{pkl} is not used" in out.out
    s1, a, data_a, _ = final_state(straight, continued_config(pkl, data))
    s2, b, data_b, _ = final_state(resumed, continued_config(pkl, data))
    assert s1 == s2 == end
    chex.assert_trees_all_equal(a, b)
    assert data_a == data_b and data_a["next_index"] == end


def test_a_checkpoint_of_another_model_names_the_parameter(tmp_path, paper):
    pkl, data, _, _ = paper
    config = continued_config(pkl, data)
    config.model.d_ffn = 64
    with pytest.raises(ValueError) as e:
        train_on_one_device(config, str(tmp_path / "run"))
    assert str(e.value) == (
        f"{pkl} is of another model than the config's: parameter layer_0/w1 is "
        "float32[64, 128], the config's model has float32[64, 64]"
    )
    assert not os.listdir(tmp_path / "run" / "checkpoints")


def test_another_optimiser_state_is_refused(tmp_path, paper):
    pkl, data, _, ckpt = own_pickle(paper, tmp_path)
    ckpt["opt_state"] = jax.tree.map(np.asarray, optax.adam(1e-3).init(ckpt["params"]))
    with open(pkl, "wb") as f:
        pickle.dump(ckpt, f)
    with pytest.raises(ValueError) as e:
        train_on_one_device(continued_config(pkl, data), str(tmp_path / "run"))
    assert str(e.value) == (
        f"{pkl}: its optimiser state (ScaleByAdamState(array, {{params}}, {{params}}), "
        "EmptyState()) is not this run's (clip_by_global_norm + adamw with a decay mask: "
        "(EmptyState(), (ScaleByAdamState(array, {params}, {params}), "
        "MaskedState(EmptyState()), ScaleByScheduleState(array))))"
    )


@pytest.mark.parametrize(
    "spec,message",
    [
        ("paper:/no/such/checkpoint.pkl", "paper checkpoint not found: /no/such/checkpoint.pkl"),
        ("orbax:/tmp/x", "train.init_from='orbax:/tmp/x': expected paper:<checkpoint.pkl"),
    ],
)
def test_a_bad_init_from_is_one_line(tmp_path, spec, message):
    proc = run_train(tmp_path / "w", f"--config.train.init_from={spec}")
    assert_one_line_error(proc, message, tmp_path / "w")


def test_the_data_position_counts_the_papers_micro_batches():
    """With grad_accum 2 the paper's micro-batch is half our batch: position 6 is our step 3."""
    config = continued_config("ckpt.pkl", "/data", batch_size=8, grad_accum=2)
    tokens = np.arange(96 * 32, dtype=np.uint32)  # window w holds 32w .. 32w + 31
    train = WindowIterator(tokens, 8, 32, layout=pipeline.train_layout(config))
    init_from.seek_data(train, 6, config)
    # The paper's micro-batches 6 and 7: windows 24 .. 31, in order.
    np.testing.assert_array_equal(next(train), tokens[24 * 32 : 32 * 32].reshape(8, 32))
    with pytest.raises(ValueError, match="data_position 5 is not a whole number of steps"):
        init_from.seek_data(train, 5, config)
    with pytest.raises(ValueError, match="data_position 24 is past this run's training split"):
        init_from.seek_data(train, 24, config)
