"""The skeleton of a compare config (`python -m experiments.compare`).

A compare config is a training config's shared blocks (`seed`, `data`, `train`, `mesh`; the
recipe of `recipe.base_config`) plus `models`, a dict of model blocks, and `compare`, the
comparison's own settings. `experiments.compare` builds each model's run config by copying the
shared blocks and setting that model block as `model`.
"""

import ml_collections

from gpn_jax.configs import recipe
from gpn_jax.models import factory


def compare_config(models: dict) -> ml_collections.ConfigDict:
    """Shared blocks + `models` ({name: model ConfigDict}, run and tabled in this order)."""
    c = recipe.base_config()
    del c["model"]  # each entry of `models` becomes one run's `model` block
    c.models = ml_collections.ConfigDict({k: recipe.model_block(m) for k, m in models.items()})
    c.compare = ml_collections.ConfigDict(
        dict(
            models=",".join(models),  # which entries of `models` run, in table order
            labels=ml_collections.ConfigDict({k: factory.label(k) for k in models}),
            lambada_path="",  # lambada_openai jsonl (or --lambada_path); empty: no LAMBADA
            lambada_batch_size=16,
        )
    )
    return c
