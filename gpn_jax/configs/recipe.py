"""Shared ml_collections config pieces: the training recipe, the data block, and the `:arg` variants.

Every experiment config (`experiments/configs/*.py`) is `get_config(arg=None)` built on
`base_config`; `--config=path.py:cpu` shrinks any of them for a CPU run (small widths, short
windows, few steps) without touching the model family or recipe.
"""

import dataclasses
import enum

import ml_collections

from gpn_jax.configs import blocks
from gpn_jax.models import configs as model_configs
from gpn_jax.models import factory


def base_config() -> ml_collections.ConfigDict:
    """The paper's recipe: AdamW 6e-4, 100 warm-up steps, cosine to 10 %, wd 0.1, clip 1.0.

    The data, train, logging and mesh blocks hold every field `configs.blocks` declares, at
    its default; the model block is each experiment's (`model_block`)."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.model = ml_collections.ConfigDict()  # filled by each experiment: family + its fields
    for name in blocks.BLOCKS:
        c[name] = blocks.config_block(name)
    return c


def tiny_train(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The `*_tiny` configs' training block: 20 steps of 4 x 32 tokens (CPU tests, smoke runs)."""
    c.train.update(
        dict(
            batch_size=4,
            seq_len=32,
            steps=20,
            warmup_steps=5,
            learning_rate=3e-3,
            log_every=5,
            eval_every=10,
            eval_batches=2,
            checkpoint_every=10,
        )
    )
    return c


def model_block(fields) -> ml_collections.ConfigDict:
    """A `model` block holding every field of its family's config dataclass: `fields` plus the
    dataclass defaults, so each one can be set from the command line
    (`--config.model.scan_impl=fused`); ml_collections only overrides fields that exist."""
    cfg = factory.family_config(fields)  # validates family and field names (no JAX)
    plain = lambda v: v.value if isinstance(v, enum.Enum) else v  # enums as their strings
    values = {k: plain(v) for k, v in dataclasses.asdict(cfg).items()}
    return ml_collections.ConfigDict(dict(family=fields.get("family", "gpn"), **values))


def with_model(arg: str | None, model: dict, **train) -> ml_collections.ConfigDict:
    """The shared recipe with this `model` block and these `train` fields, then `arg`'s
    variant (`apply_arg`): a named config is its model and what it trains differently."""
    c = base_config()
    c.model = ml_collections.ConfigDict(model)
    c.train.update(train)
    return apply_arg(c, arg)


def apply_arg(c: ml_collections.ConfigDict, arg: str | None) -> ml_collections.ConfigDict:
    """Completes the model block (`model_block`); `:cpu` shrinks the config for a quick CPU
    run, None leaves it unchanged."""
    c.model = model_block(c.model)
    if not arg:
        return c
    if arg != "cpu":
        raise ValueError(f"unknown config variant {arg!r}; the only variant is ':cpu'")
    # each model field's own `:cpu` rule (`models.configs`: vocab 2048, widths capped, ...)
    shrink = model_configs.field_rule(model_configs.CPU, type(factory.family_config(c.model)))
    for field, rule in shrink.items():
        c.model[field] = rule(c.model[field])
    # each train field's own: 8 x 128 tokens, 200 steps, evaluations every 100 (`blocks.Train`)
    for field, rule in blocks.rule("train", blocks.CPU).items():
        c.train[field] = rule(c.train[field])
    return c
