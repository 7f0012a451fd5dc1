"""A tiny GPN+M for CPU tests and quick experiments (vocab 512, d=64, 2 heads x 16 x 32)."""

import ml_collections

from gpn_jax.configs import recipe


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = recipe.base_config()
    c.model = ml_collections.ConfigDict(
        dict(
            family="gpn",
            vocab_size=512,
            d_model=64,
            d_emb=32,
            d_ffn=128,
            n_heads=2,
            d_key=16,
            d_value=32,
            loss_chunk=32,
        )
    )
    return recipe.apply_arg(recipe.tiny_train(c), arg)
