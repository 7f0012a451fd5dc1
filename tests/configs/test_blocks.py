"""gpn_jax.configs.blocks: the train, data, logging and mesh fields, each declared once, are what
the recipe builds, what validation bounds, what `:cpu` shrinks and what an older config lacks."""

import dataclasses

import pytest

from experiments.configs import gpn_m_tiny
from gpn_jax.configs import blocks, gpn_m_1l_130m, recipe
from gpn_jax.training import validate


def refused(config, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern) as err:
        validate.check_config(config)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", sorted(blocks.BLOCKS))
def test_the_recipe_blocks_are_the_declarations(name):
    """Every declared field at its default, its doc one line; nothing else."""
    built = recipe.base_config()[name]
    fields = dataclasses.fields(blocks.BLOCKS[name])
    assert set(built.keys()) == {f.name for f in fields}
    for f in fields:
        value = built[f.name]
        assert (value.to_dict() if hasattr(value, "to_dict") else value) == blocks.default(f)
        assert blocks.doc(name, f.name) and "\n" not in blocks.doc(name, f.name)


def test_the_declared_types_hold_on_override():
    c = recipe.base_config()
    with pytest.raises(TypeError):
        c.train.steps = "many"
    c.logging.progress_bar = True  # declared `bool | None`, None by default
    with pytest.raises(TypeError):
        c.logging.progress_bar = "yes"


MESH_BOUNDS = [
    (field, minimum, blocks.rule("mesh", blocks.MAXIMUM)[field])
    for field, minimum in blocks.rule("mesh", blocks.MINIMUM).items()
]


@pytest.mark.parametrize("field, minimum, maximum", MESH_BOUNDS)
def test_the_mesh_bounds_are_enforced(field, minimum, maximum):
    c = gpn_m_tiny.get_config()
    c.mesh[field] = minimum
    validate.check_static(c)
    c.mesh[field] = minimum - 1
    refused(c, rf"^config\.mesh\.{field} must be (a positive integer|an integer >= -1), got ")
    c.mesh[field] = maximum + 1
    refused(c, rf"^config\.mesh\.{field} must be at most {maximum}, got {maximum + 1}$")


@dataclasses.dataclass(frozen=True)
class _TrainWithEMA(blocks.Train):
    """The train block with two new fields, declared as any train field is."""

    ema_every: int = blocks.count(4, "steps between EMA updates", maximum=1000, cpu=2)
    ema_decay: float = blocks.number(0.99, "the EMA's decay", low=0.0, high=1.0, closed=False)


def test_a_new_train_field_is_one_declaration(monkeypatch):
    """Declared, and nothing else edited: the recipe holds it, `:cpu` shrinks it, validation
    bounds it in one line, and a config saved without it reads with its default."""
    monkeypatch.setitem(blocks.BLOCKS, "train", _TrainWithEMA)
    c = gpn_m_tiny.get_config()
    assert (c.train.ema_every, c.train.ema_decay) == (4, 0.99)
    assert gpn_m_1l_130m.get_config("cpu").train.ema_every == 2
    assert blocks.doc("train", "ema_every") == "steps between EMA updates"
    validate.check_config(c)
    c.train.ema_every = 0
    refused(c, r"^config\.train\.ema_every must be a positive integer, got 0$")
    c.train.ema_every = 1001
    refused(c, r"^config\.train\.ema_every must be at most 1000, got 1001$")
    c.train.ema_every, c.train.ema_decay = 4, 1.0
    refused(c, r"^config\.train\.ema_decay must be a finite number in \[0, 1\), got 1\.0$")
    del c.train["ema_every"]
    assert blocks.complete(c).train.ema_every == 4


def test_complete_fills_what_an_older_config_lacks_and_keeps_the_rest():
    want = gpn_m_tiny.get_config()
    want.train.steps = 7  # a value of its own: kept
    old = gpn_m_tiny.get_config()
    old.train.steps = 7
    del old["logging"], old.train["carry_state"], old.data["train_layout"], old.mesh["axis_rules"]
    assert blocks.complete(old).to_dict() == want.to_dict()
    old.lock()  # as a loaded config may be
    assert blocks.complete(old).to_dict() == want.to_dict() and old.is_locked


def test_helpfull_lists_every_declared_field_with_its_default_bounds_and_doc():
    from gpn_jax.io import cli

    # the help of a module defining no flag (importing an entry point here would define its
    # flags a second time in a worker that imported another one: gpn-train's is checked from
    # its console script, tests/entry_points/test_entry_points.py)
    text = cli.help_text("gpn_jax.configs.blocks", True, blocks.fields_help)
    flat = " ".join(text.split())
    for name, cls in blocks.BLOCKS.items():
        for f in dataclasses.fields(cls):
            assert f"--config.{name}.{f.name} (default {blocks.default(f)!r}" in flat
            assert " ".join(blocks.doc(name, f.name).split()) in flat
    assert "--config.train.steps (default 10000, at least 1)" in flat
    assert "--config.train.b2 (default 0.95, in [0, 1))" in flat
    assert max(len(line) for line in blocks.fields_help().splitlines()) <= 100
    short = cli.help_text("gpn_jax.configs.blocks", False, blocks.fields_help)
    assert "--config.train.steps (default" not in short and "the config's fields" in short
