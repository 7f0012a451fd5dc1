"""A tiny Transformer++ for CPU tests and quick experiments (vocab 512, d=64, 2 layers, 2 heads)."""

import ml_collections

from gpn_jax.configs import recipe


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = recipe.base_config()
    c.model = ml_collections.ConfigDict(
        dict(
            family="transformer",
            vocab_size=512,
            d_model=64,
            n_layers=2,
            n_heads=2,
            d_ffn=128,
            max_seq_len=32,
            loss_chunk=32,
        )
    )
    return recipe.apply_arg(recipe.tiny_train(c), arg)
