"""gpn_jax.training.validate: every size field of every model family, and the train block."""

import dataclasses
import importlib

import pytest

from experiments.configs import gdn_tiny, gpn_m_tiny, transformer_tiny
from gpn_jax.configs import blocks
from gpn_jax.models.factory import FAMILIES
from gpn_jax.training import validate

TINY = {"gpn": gpn_m_tiny, "transformer": transformer_tiny, "gdn": gdn_tiny}

TRAIN_MINIMUM = blocks.rule("train", blocks.MINIMUM)  # the declared minimum of each count


def int_fields(family):
    f = FAMILIES[family]
    cls = getattr(importlib.import_module(f.module), f.config_class)
    return [f.name for f in dataclasses.fields(cls) if f.type in (int, "int")]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_int_field_of_every_family_is_checked(family):
    assert {"vocab_size", "d_model"} <= set(int_fields(family)) <= set(validate.MODEL_MINIMUM)
    config = TINY[family].get_config()
    validate.check_config(config)  # the tiny config itself is valid
    for field in int_fields(family):
        bad = TINY[family].get_config()
        bad.model[field] = validate.MODEL_MINIMUM[field] - 1
        with pytest.raises(ValueError, match=rf"^config\.model\.{field} must be ") as err:
            validate.check_config(bad)
        assert "\n" not in str(err.value)


def test_gpn_without_memory_allows_zero_heads():
    c = gpn_m_tiny.get_config()
    c.model.update(dict(memory=False, n_heads=0, d_key=0, d_value=0))
    validate.check_config(c)


@pytest.mark.parametrize("field", sorted(TRAIN_MINIMUM))
def test_train_fields_below_minimum(field):
    c = gpn_m_tiny.get_config()
    c.train[field] = TRAIN_MINIMUM[field] - 1
    with pytest.raises(ValueError, match=rf"^config\.train\.{field} must be an? "):
        validate.check_config(c)


def test_batch_must_split_over_accumulation_and_data_parallel_devices():
    c = gpn_m_tiny.get_config()
    c.train.batch_size = 4
    validate.check_config(c, data_parallel=4)
    with pytest.raises(ValueError, match=r"= 1 x 8, got 4$"):
        validate.check_config(c, data_parallel=8)
    c.train.grad_accum = 3
    with pytest.raises(ValueError, match=r"grad_accum \(3\), got 4$"):
        validate.check_config(c)


def test_explicit_kernels_are_refused_over_a_tensor_parallel_mesh():
    """The memory kernels run per data / fsdp shard; under tensor parallelism the window keeps
    XLA's formulas, so asking for kernels there is a one-line error naming the alternatives."""
    c = gpn_m_tiny.get_config()
    validate.check_config(c, data_parallel=2, tensor=2)  # auto: falls back by itself
    c.model.kernels = "pallas"
    validate.check_config(c, data_parallel=2, tensor=1)
    with pytest.raises(ValueError, match=r"^config.model.kernels=pallas runs per data/fsdp shard"):
        validate.check_config(c, data_parallel=2, tensor=2)


@pytest.mark.parametrize(
    "eval_every, checkpoint_every, steps, ok",
    [
        (10, 10, 20, True),
        (5, 10, 20, True),
        (20, 10, 20, True),
        (3, 7, 20, False),  # evaluations at 3, 6, ..., 18; checkpoints at 7, 14, 20
        (3, 7, 21, True),  # ... and 21, the final step, is both
        (30, 10, 20, True),  # no periodic evaluation at all: nothing to rank
        (0, 10, 20, True),
    ],
)
def test_keep_best_needs_an_evaluation_on_a_checkpoint_step(
    eval_every, checkpoint_every, steps, ok
):
    c = gpn_m_tiny.get_config()
    c.train.update(dict(eval_every=eval_every, checkpoint_every=checkpoint_every, steps=steps))
    if ok:
        validate.check_config(c)
    else:
        with pytest.raises(ValueError, match="keep_best=1 needs an evaluation on a checkpoint"):
            validate.check_config(c)
    c.train.keep_best = 0
    validate.check_config(c)


@pytest.mark.parametrize("fraction", [-0.1, 1.0])
def test_heldout_fraction_range(fraction):
    c = gpn_m_tiny.get_config()
    c.data.heldout_fraction = fraction
    with pytest.raises(ValueError, match=r"heldout_fraction must be in \[0, 1\)"):
        validate.check_config(c)


@pytest.mark.parametrize("ratio", [-0.1, 1.5, float("nan")])
def test_min_lr_ratio_in_unit_interval(ratio):
    """Issue 45 item 8: a negative min_lr_ratio logged a negative learning rate (ascent)."""
    c = gpn_m_tiny.get_config()
    c.train.min_lr_ratio = ratio
    with pytest.raises(ValueError, match=r"^config\.train\.min_lr_ratio must be in \[0, 1\]"):
        validate.check_config(c)
    c.train.min_lr_ratio = 0.0
    validate.check_config(c)


def test_grad_clip_positive_or_off():
    """Issue 45 item 8: a negative grad_clip flipped the gradient's sign; 0 means no clipping."""
    c = gpn_m_tiny.get_config()
    c.train.grad_clip = -1.0
    with pytest.raises(ValueError, match=r"^config\.train\.grad_clip must be > 0 .* got -1\.0"):
        validate.check_config(c)
    c.train.grad_clip = 0.0
    validate.check_config(c)


def test_grad_clip_zero_leaves_gradients_unclipped():
    import jax.numpy as jnp

    from gpn_jax.training.optimizer import make_optimizer

    c = gpn_m_tiny.get_config()
    c.train.update(grad_clip=0.0, weight_decay=0.0, warmup_steps=0, learning_rate=1.0)
    g = {"w": jnp.array([3.0, -4.0])}  # global norm 5
    opt = make_optimizer(c.train, {"w": False})
    update, _ = opt.update(g, opt.init(g), g)
    # Adam's first step is -lr * g / (|g| + eps): the sign of each unclipped, non-zero gradient.
    assert jnp.all(jnp.sign(update["w"]) == -jnp.sign(g["w"]))


def test_unknown_compute_dtype_lists_the_choices():
    """Issue 45 item 7: compute_dtype=float7 gave numpy's TypeError traceback."""
    c = gpn_m_tiny.get_config()
    c.model.compute_dtype = "float7"
    with pytest.raises(
        ValueError,
        match=r"^config\.model\.compute_dtype must be one of float32, bfloat16, float16, "
        r"float64, got 'float7'$",
    ):
        validate.check_config(c)


def test_empty_metric_writers_is_refused():
    """Issue 45 item 8: an empty logging.writers trained without metrics.jsonl or run_info."""
    c = gpn_m_tiny.get_config()
    c.logging.writers = " , "
    with pytest.raises(ValueError, match=r"^config\.logging\.writers is empty"):
        validate.check_config(c)


def test_mesh_checks_are_separate_from_static_ones():
    c = gpn_m_tiny.get_config()
    c.train.batch_size = 4
    validate.check_static(c)  # nothing mesh-dependent here
    with pytest.raises(ValueError, match=r"= 1 x 8, got 4$"):
        validate.check_mesh(c, data_parallel=8)
    with pytest.raises(ValueError, match=r"multiple of the 3 hosts, got 4$"):
        validate.check_mesh(c, data_parallel=1, process_count=3)


def test_unknown_writer_and_remat_segment_are_checked_here():
    c = gpn_m_tiny.get_config()
    c.logging.writers = "jsonl,csv"
    with pytest.raises(ValueError, match=r"unknown metric writer 'csv'"):
        validate.check_static(c)
    c = gpn_m_tiny.get_config()
    c.model.remat_segment = 5
    with pytest.raises(ValueError, match=r"make config\.train\.seq_len a multiple of"):
        validate.check_static(c)
