"""The training system: bit-identical resume, accumulation, outputs, divergence, corrupt checkpoints."""

import functools
import glob
import hashlib
import json
import os
import shutil

import chex
import jax
import ml_collections
import numpy as np
import pytest

from gpn_jax.checkpoints.manager import Checkpointer
from gpn_jax.models import factory
from gpn_jax.parallel import mesh as meshlib
from gpn_jax.training import setup, validate
from gpn_jax.training import train_step as ts
from gpn_jax.training.loop import (
    TrainingError,
    evaluate_heldout,
    model_difference,
    train_and_evaluate,
)
from gpn_jax.training.optimizer import learning_rate_schedule, make_optimizer
from tests.helpers.training import final_state, tiny_config, train_on_one_device
from tests.tolerance import assert_rel_close, f32_bound, rel_err


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory):
    """The workdir of a finished `tiny_config(steps=2)` run (checkpoint 2); tests resume copies."""
    workdir = str(tmp_path_factory.mktemp("two_step") / "run")
    train_on_one_device(tiny_config(steps=2), workdir)
    return workdir


def with_tokenizer_of(run, workdir) -> str:
    """`workdir`, new, holding only `run`'s tokenizer (trained on the same corpus with the
    same vocab; training it again costs seconds): a run there uses it and starts at step 0."""
    os.makedirs(workdir)
    shutil.copy(os.path.join(run, "tokenizer.model"), workdir)
    return str(workdir)


@pytest.fixture(scope="module")
def four_step_run(tmp_path_factory, two_step_run):
    """The workdir of a finished `tiny_config(steps=4)` run, uninterrupted; tests read it or
    change copies."""
    workdir = with_tokenizer_of(two_step_run, tmp_path_factory.mktemp("four_step") / "run")
    train_on_one_device(tiny_config(steps=4), workdir)
    return workdir


def copy_of(workdir, tmp_path) -> str:
    return shutil.copytree(workdir, str(tmp_path / "copy"))


def test_a_run_trains_on_the_devices_it_is_given(tmp_path, capsys, two_step_run):
    """`devices`: the config's mesh is laid over those devices, not all of `jax.devices()`;
    a mesh that needs more of them is a one-line error before the workdir is touched."""
    workdir = with_tokenizer_of(two_step_run, tmp_path / "run")
    final = train_and_evaluate(tiny_config(steps=1), workdir, devices=jax.devices()[2:4])
    assert final["step"] == 1
    assert "mesh {'data': 2, 'fsdp': 1, 'tensor': 1}" in capsys.readouterr().err
    config = tiny_config(steps=1)
    config.mesh.data = 4
    with pytest.raises(ValueError, match="needs 4 devices, have 2"):
        train_and_evaluate(config, str(tmp_path / "other"), devices=jax.devices()[:2])
    assert not os.path.exists(tmp_path / "other")


def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path, two_step_run, four_step_run):
    straight, resumed = four_step_run, copy_of(two_step_run, tmp_path)
    train_on_one_device(tiny_config(steps=4), resumed)  # same command again: resumes at step 2
    s1, a, data_a, meta_a = final_state(straight, tiny_config())
    s2, b, data_b, meta_b = final_state(resumed, tiny_config())
    assert s1 == s2 == 4
    chex.assert_trees_all_equal(a, b)
    assert data_a == data_b and meta_a == meta_b
    tokenizer = open(os.path.join(straight, "tokenizer.model"), "rb").read()
    assert meta_a["tokenizer_sha256"] == hashlib.sha256(tokenizer).hexdigest()  # readers check it
    assert open(os.path.join(straight, ".gpn_jax.lock")).read() == ""  # released: no holder
    # What the user sees: metrics as JSONL and TensorBoard events, final metrics with both PPLs.
    rows = [json.loads(line) for line in open(os.path.join(straight, "metrics.jsonl"))]
    rows = [r for r in rows if "run_info" not in r]  # the session's first record
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]
    assert all({"loss", "lr", "tokens_per_s", "grad_norm"} <= set(r) for r in rows if "loss" in r)
    # The logged lr is the one step s's update applied: optax's schedule at the count of
    # updates before it (s - 1), so 0.0 for step 1 during warm-up. Exact: the same compiled
    # schedule (the run compiles it once rather than dispatching its ops at every row).
    schedule = jax.jit(learning_rate_schedule(tiny_config().train))
    assert [r["lr"] for r in rows if "loss" in r] == [float(schedule(s - 1)) for s in range(1, 5)]
    assert [r for r in rows if "loss" in r][0]["lr"] == 0.0  # rows[0] is the run_info line
    assert glob.glob(os.path.join(straight, "tensorboard", "events.out.tfevents.*"))
    final = json.load(open(os.path.join(straight, "final_metrics.json")))
    assert {"heldout_ppl", "unigram_ppl", "step", "tokens_seen"} <= set(final)
    assert final["tokens_seen"] == 4 * 8 * 32


@functools.cache
def tiny_setup():
    """(model, optimizer, initial state, batch) of `tiny_config()`, shared by the step tests."""
    config = tiny_config()
    model = factory.build_model(config.model)
    opt = make_optimizer(config.train, model.weight_decay_mask)
    # committed to the device, as the step's outputs are: both calls then hit one executable
    state = jax.device_put(ts.init_train_state(model, opt, jax.random.PRNGKey(0)), jax.devices()[0])
    batch = jax.random.randint(jax.random.PRNGKey(1), (8, 32), 0, config.model.vocab_size)
    return model, opt, state, batch


@functools.cache
def tiny_step(grad_accum: int):
    """The jitted plain train step of `tiny_setup()`: compiled once per `grad_accum`."""
    model, opt, _, _ = tiny_setup()
    return jax.jit(ts.make_train_step(model, opt, grad_accum))


def test_gradient_accumulation_equals_the_full_batch():
    model, opt, state, batch = tiny_setup()
    one, m1 = tiny_step(1)(state, batch)
    acc, m2 = tiny_step(2)(state, batch)
    # float32 sums in another order (two half-batch sums vs one): the longest reduction is the
    # gradient's sum over the B*T = 256 tokens after the vocab's 512-way logsumexp; x8 margin
    bound = f32_bound(8 * 32 + 512, 8)
    assert rel_err(m2["loss"], m1["loss"]) <= bound
    # the moments hold the gradients (step 1's learning rate is 0 in warm-up: params unchanged)
    assert_rel_close(acc.opt_state, one.opt_state, bound, "optimizer moments")
    assert_rel_close(acc.params, one.params, bound, "params")
    assert int(one.step) == int(acc.step) == 1
    with pytest.raises(ValueError, match="batch size 8 is not divisible by grad_accum 3"):
        ts.make_train_step(model, opt, 3)(state, batch)


def all_checkpoints(workdir, config):
    """{step: state} of every checkpoint in `workdir`."""
    model = factory.build_model(config.model)
    opt = make_optimizer(config.train, model.weight_decay_mask)
    abstract = jax.eval_shape(lambda r: ts.init_train_state(model, opt, r), jax.random.PRNGKey(0))
    with Checkpointer(workdir, keep=None, async_save=False, cleanup_tmp=False) as ckpt:
        return {s: ckpt.restore(abstract, s)[1] for s in ckpt.all_steps()}


def test_non_finite_step_is_never_checkpointed(tmp_path, monkeypatch, two_step_run):
    workdir = with_tokenizer_of(two_step_run, tmp_path / "run")
    # A huge learning rate drives the weights to inf within a few steps (the loss of the
    # step that does it is still finite: it is computed before the update). Sharded step:
    # the tests' 8 CPU devices make a data=8 mesh; metrics are read one step late. The config
    # checks refuse such a rate up front; the guard under test is for runs that diverge
    # anyway, so those bounds are lifted here.
    monkeypatch.setattr(validate, "check_bounds", lambda config: None)
    config = tiny_config(
        steps=50,
        checkpoint_every=1,
        keep_checkpoints=100,
        learning_rate=1e30,
        warmup_steps=0,
        grad_clip=1e30,
    )
    pattern = r"step (\d+) is not finite .*stopped without applying it; newest checkpoint"
    with pytest.raises(TrainingError, match=pattern) as err:
        train_on_one_device(config, workdir)
    bad_step = int(str(err.value).split("step ")[1].split()[0])
    assert "\n" not in str(err.value)
    assert f"checkpoint (all values finite): step {bad_step - 1} in " in str(err.value)
    saved = all_checkpoints(workdir, config)
    assert sorted(saved) == list(range(1, bad_step))
    for step, state in saved.items():
        for path, leaf in jax.tree_util.tree_leaves_with_path(state):
            assert np.isfinite(np.asarray(leaf)).all(), (step, jax.tree_util.keystr(path))


def test_plain_step_returns_the_previous_state_when_not_finite():
    _, _, state, batch = tiny_setup()
    step = tiny_step(1)  # the compiled step of the accumulation test
    new, metrics = step(state, batch)
    assert bool(metrics[ts.FINITE]) and int(new.step) == int(state.step) + 1
    # Finite weights too large for float32 arithmetic: the step's loss overflows.
    state = new._replace(params=jax.tree.map(lambda x: x * 1e30, new.params))
    assert ts.all_finite(state)
    new, metrics = step(state, batch)
    assert not bool(metrics[ts.FINITE])
    # The rejected step changed nothing: every leaf (step counter, opt state, rng) as before.
    chex.assert_trees_all_equal(new, state)
    assert ts.all_finite(new)


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(tmp_path, caplog, four_step_run):
    workdir = copy_of(four_step_run, tmp_path)
    for f in glob.glob(
        os.path.join(workdir, "checkpoints", "4", "state", "**", "d", "*"), recursive=True
    ):
        with open(f, "r+b") as fh:
            fh.truncate(8)
    final = train_on_one_device(tiny_config(steps=6), workdir)
    assert final["step"] == 6
    assert "checkpoint step 4 unreadable" in caplog.text


def test_no_heldout_set_trains_and_says_so(tmp_path, two_step_run):
    # Periodic evaluation asked for, but heldout_fraction=0 keeps nothing to evaluate on.
    config = tiny_config(steps=2, eval_every=1, checkpoint_every=1)
    config.data.heldout_fraction = 0.0
    workdir = with_tokenizer_of(two_step_run, tmp_path / "run")
    final = train_on_one_device(config, workdir)
    on_disk = json.load(open(os.path.join(workdir, "final_metrics.json")))
    assert final == on_disk
    assert on_disk == {
        "step": 2,
        "tokens_seen": 2 * 8 * 32,
        "heldout_tokens": 0,
        "heldout": "none kept (data.heldout_fraction=0)",
    }


MATH_FREE = {
    "model.loss_chunk": 16,
    "model.scan_impl": "autodiff",
    "model.remat_segment": 16,
    "model.compute_dtype": "bfloat16",
    "model.memory_dtype": "bfloat16",
    "train.log_every": 2,
    "train.eval_every": 2,
    "train.eval_batches": 1,
    "train.checkpoint_every": 1,
}


@pytest.mark.parametrize("field", sorted(f for f in MATH_FREE if f.startswith("model.")))
def test_math_free_model_field_is_no_model_difference(field):
    saved = tiny_config().model.to_dict()
    changed = dict(saved, **{field.split(".")[1]: MATH_FREE[field]})
    assert saved != changed and model_difference(saved, changed) is None


def test_resume_with_every_math_free_field_changed(tmp_path, two_step_run):
    workdir = copy_of(two_step_run, tmp_path)
    config = tiny_config(steps=3)
    for field, value in MATH_FREE.items():
        block, name = field.split(".")
        config[block][name] = value
    assert train_on_one_device(config, workdir)["step"] == 3


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("d_model", 32, "d_model 64 (checkpoint) != 32 (config)"),
        ("vocab_size", 256, "vocab_size 512 (checkpoint) != 256 (config)"),
        ("family", "gdn", "family gpn (checkpoint) != gdn (config)"),
    ],
)
def test_model_difference_names_the_field(field, value, expected):
    saved = tiny_config().model.to_dict()
    assert model_difference(saved, dict(saved, **{field: value})).startswith(expected)


def test_checkpoint_of_another_model_is_reported_before_any_array_is_read(
    tmp_path, monkeypatch, two_step_run
):
    workdir = copy_of(two_step_run, tmp_path)

    def no_array_read(*args, **kwargs):
        raise AssertionError("arrays were read before the config was compared")

    monkeypatch.setattr(Checkpointer, "restore", no_array_read)
    config = tiny_config(steps=3)
    config.model.d_model = 32
    with pytest.raises(TrainingError) as err:
        train_on_one_device(config, workdir)
    assert str(err.value) == (
        f"checkpoint in {os.path.join(workdir, 'checkpoints')} is of another model: "
        "d_model 64 (checkpoint) != 32 (config); use a fresh --workdir"
    )
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2"]


@pytest.mark.parametrize(
    "source, message",
    [("/no/such/corpus.txt", "data path not found"), ("tfds:no_such_dataset_xyz", "not found")],
)
def test_bad_data_is_reported_before_the_state_is_built(tmp_path, monkeypatch, source, message):
    """The data is read before the initial state is compiled (seconds at scale, minutes on a
    pod), so a missing corpus costs nothing."""

    def built_too_early(*_):
        raise AssertionError("the initial state was built before the data was read")

    monkeypatch.setattr(setup.Run, "init_state", built_too_early)
    config = tiny_config()
    config.data.source = source
    with pytest.raises((FileNotFoundError, ValueError), match=message):
        train_on_one_device(config, str(tmp_path / "run"))


class _Batches:
    """Held-out windows stand-in: batch i is filled with the value i."""

    def heldout_windows(self):
        return (np.full((2, 4), i, np.int32) for i in range(7))


@pytest.mark.parametrize(
    "max_batches, stride, picked",
    [(0, 1, range(7)), (2, 1, [0, 1]), (0, 3, [0, 3, 6]), (2, 3, [0, 3]), (0, 9, [0])],
)
def test_final_evaluation_reads_every_kth_batch_up_to_the_cap(max_batches, stride, picked):
    one = ml_collections.ConfigDict({"data": 1, "fsdp": 1, "tensor": 1})
    mesh = meshlib.make_mesh(one, jax.devices()[:1])
    # "loss" of a batch = its value summed over its 8 tokens: the mean names the batches read
    step = lambda params, batch: (batch.sum().astype(np.float32), batch.size)
    ev = evaluate_heldout(step, None, _Batches(), mesh, max_batches, stride)
    assert ev["loss"] == pytest.approx(np.mean(picked), abs=0)
    assert sorted(set(ev["tokens"].ravel().tolist())) == list(picked)


@pytest.mark.parametrize("reuse, shown", [(True, True), (False, False)])
def test_the_heap_and_the_progress_bar_follow_the_config(
    tmp_path, monkeypatch, capsys, reuse, shown, two_step_run
):
    """The compiler's freed heap released, and the steps' buffers kept or not as the config
    says (`train.reuse_step_memory`, `training.host_memory`), set up once per run; the
    progress bar shown or not as the logging config says (one run checks both)."""
    from gpn_jax.training import loop

    calls = []
    monkeypatch.setattr(loop, "steady_step_memory", lambda r: calls.append(r) or r)
    config = tiny_config(steps=3, checkpoint_every=3)
    config.train.reuse_step_memory = reuse
    config.logging.progress_bar = shown  # False: runs side by side (the MQAR sweep's workers)
    train_on_one_device(config, with_tokenizer_of(two_step_run, tmp_path / "run"))
    assert calls == [reuse]  # after the first step's call (it compiled the step), not every step
    assert ("step/s" in capsys.readouterr().err) == shown
