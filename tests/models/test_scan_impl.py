"""`scan_impl` is an enum inside the model and a plain string in configs and on the command line."""

import dataclasses

import pytest

from gpn_jax.configs import recipe
from gpn_jax.models.gpn import GPNConfig, ScanImpl

SIZES = dict(vocab_size=16, d_model=8, d_emb=4, d_ffn=8, n_heads=1, d_key=2, d_value=2)


def test_config_strings_become_the_enum():
    cfg = GPNConfig(**SIZES, scan_impl="fused")
    assert cfg.scan_impl is ScanImpl.FUSED
    assert dataclasses.replace(cfg, scan_impl="autodiff").scan_impl is ScanImpl.AUTODIFF
    assert GPNConfig(**SIZES).scan_impl is ScanImpl.FUSED  # the default
    with pytest.raises(ValueError, match="scan_impl must be 'autodiff' or 'fused', got 'nope'"):
        GPNConfig(**SIZES, scan_impl="nope")


def test_model_block_holds_the_string_so_overrides_type_check():
    block = recipe.model_block(dict(family="gpn", **SIZES, scan_impl="fused"))
    assert type(block.scan_impl) is str and block.scan_impl == "fused"
    block.scan_impl = "autodiff"  # what --config.model.scan_impl=autodiff does
    assert block.scan_impl == "autodiff"
