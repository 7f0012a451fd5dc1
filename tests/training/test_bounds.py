"""Upper bounds of every numeric config field (issue 51, case 8): counts that land in int32,
finite floats in their ranges, the seed, and the model's size, each refused in one line naming
the field before anything is allocated."""

import math
import subprocess

import pytest

from experiments.configs import gdn_tiny, gpn_m_tiny, transformer_tiny
from gpn_jax.configs import blocks
from gpn_jax.training import validate
from tests.helpers.cli import ROOT, assert_one_line_error, train_cmd

TRAIN_MINIMUM = blocks.rule("train", blocks.MINIMUM)  # the declared minimum of each count


def refused(config, pattern: str):
    with pytest.raises(ValueError, match=pattern) as err:
        validate.check_config(config)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("field", sorted(TRAIN_MINIMUM))
def test_every_train_count_is_int32(field):
    c = gpn_m_tiny.get_config()
    c.train[field] = 2**31 - 1
    try:
        validate.check_bounds(c)  # the bound itself is allowed (other checks aside)
    except ValueError as e:
        assert f"config.train.{field} must be at most" not in str(e)
    c.train[field] = 10**10
    if field == "grad_accum":  # the batch (int32 itself) must be a multiple of it
        refused(c, r"^config\.train\.batch_size must be a multiple of .*grad_accum \(10{10}\)")
        return
    refused(c, rf"^config\.train\.{field} must be at most 2147483647 \(int32\), got 10{{10}}$")


@pytest.mark.parametrize("field", sorted(blocks.rule("train", blocks.RANGE)))
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e300, -1e-9])
def test_every_train_float_is_finite_and_in_range(field, value):
    c = gpn_m_tiny.get_config()
    c.train[field] = value
    refused(c, rf"^config\.train\.{field} must be ")


def test_adam_decays_below_one():
    c = gpn_m_tiny.get_config()
    for field in ("b1", "b2"):
        c.train[field] = 1.0
        refused(c, rf"config\.train\.{field} must be a finite number in \[0, 1\), got 1.0")
        c.train[field] = 0.0
        validate.check_config(c)


@pytest.mark.parametrize("seed", [2**70, 2**32, -1])
def test_the_seed_is_a_32_bit_integer(seed):
    c = gpn_m_tiny.get_config()
    c.seed = 2**32 - 1
    validate.check_config(c)
    c.seed = seed
    refused(c, r"^config\.seed must be an integer in \[0, 2\^32 - 1\]")


def test_tokens_per_step_fit_int32():
    c = gpn_m_tiny.get_config()
    c.train.update(dict(batch_size=2**16, seq_len=2**16, grad_accum=1))
    refused(c, r"batch_size x config\.train\.seq_len = 4294967296 tokens per step")


@pytest.mark.parametrize("module", [gpn_m_tiny, transformer_tiny, gdn_tiny])
def test_a_model_too_large_to_allocate_names_the_field(module):
    """d_model=10**9 tried to allocate 4e18 bytes; it is refused from the config alone."""
    c = module.get_config()
    assert validate.estimated_parameters(c.model) < 10**6  # the tiny model itself is fine
    c.model.d_model = 10**9
    refused(c, r"^config\.model\.d_model=1000000000 makes the model at least .* parameters")
    c = module.get_config()
    c.model.vocab_size = 2**31
    refused(c, r"^config\.model\.vocab_size must be at most 2147483647")


def test_the_estimate_never_exceeds_the_real_count():
    """The size bound refuses only models truly over it: the estimate is a lower bound of the
    parameter count of every family."""
    from gpn_jax.models import accounting, factory

    for module in (gpn_m_tiny, transformer_tiny, gdn_tiny):
        m = module.get_config().model
        real = accounting.param_counts(factory.build_model(m))["total"]
        assert 0 < validate.estimated_parameters(m) <= real, module.__name__


def test_huge_values_through_the_cli_are_one_line_before_any_work(tmp_path):
    """`gpn-train --config.model.d_model=1000000000` (and warmup_steps, seed) stop at once."""
    for flag, text in (
        ("--config.model.d_model=1000000000", "config.model.d_model=1000000000 makes"),
        ("--config.train.warmup_steps=10000000000", "config.train.warmup_steps must be at most"),
        ("--config.seed=1180591620717411303424", "config.seed must be an integer in"),
    ):
        proc = subprocess.run(train_cmd(tmp_path / "w", flag), cwd=ROOT, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert_one_line_error(proc, text)
        assert not (tmp_path / "w").exists() or not any((tmp_path / "w").iterdir())
