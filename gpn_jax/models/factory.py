"""Builds a model object from the `model` block of an ml_collections config.

`config.model.family` picks the family; every other field goes to that family's frozen
config dataclass, so an unknown field is a clear error rather than a silent no-op.
"""

import dataclasses
import importlib

from gpn_jax.models import configs

DEFAULT = "gpn"  # a model block without `family` (older exports and configs)


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family: what code outside `models/` knows of it. The config class lives in
    the JAX-free `gpn_jax.models.configs` (each model module re-exports its own); the model
    module is imported lazily, so families stay independent and loading a config never
    imports JAX."""

    name: str  # `model.family`
    title: str  # its full name (model cards)
    module: str
    model_class: str
    config_class: str


FAMILIES = {
    f.name: f
    for f in (
        Family("gpn", "Grounded Prediction Network", "gpn_jax.models.gpn", "GPN", "GPNConfig"),
        Family("transformer", "Transformer++", "gpn_jax.models.transformer", "Transformer",
               "TransformerConfig"),
        Family("gdn", "Gated DeltaNet", "gpn_jax.models.gdn", "GatedDeltaNet", "GDNConfig"),
    )
}  # fmt: skip


def family_name(model_cfg) -> str:
    """The `family` of a model block (ConfigDict / dict), `DEFAULT` where it names none."""
    return model_cfg.get("family", DEFAULT)


def _split(model_cfg) -> tuple[str, dict]:
    """(family, the other fields) of a ConfigDict / dict; an unknown family is a ValueError."""
    fields = dict(model_cfg)
    family = fields.pop("family", DEFAULT)
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; choose one of {sorted(FAMILIES)}")
    return family, fields


def family_config(model_cfg):
    """The family's frozen dataclass config built from a ConfigDict / dict with a `family` key
    (no JAX import: experiment configs call this while loading)."""
    family, fields = _split(model_cfg)
    cls = getattr(configs, FAMILIES[family].config_class)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"unknown field(s) {unknown} for model family {family!r}")
    return cls(**fields)


def model_config(model_cfg):
    """(model class, `family_config`) of a config's `model` block; imports the family's module."""
    cfg = family_config(model_cfg)
    family = FAMILIES[_split(model_cfg)[0]]
    return getattr(importlib.import_module(family.module), family.model_class), cfg


def build_model(model_cfg):
    """Model object (see `gpn_jax.models.base.LanguageModel`) for a config's `model` block."""
    model_cls, cfg = model_config(model_cfg)
    return model_cls(cfg)
