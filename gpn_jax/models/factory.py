"""Builds a model object from the `model` block of an ml_collections config.

`config.model.family` picks the family; every other field goes to that family's frozen
config dataclass, so an unknown field is a clear error rather than a silent no-op.
"""

import dataclasses
import importlib

# family -> (module, model class, config class); imported lazily so families stay independent.
FAMILIES = {
    "gpn": ("gpn_jax.models.gpn", "GPN", "GPNConfig"),
    "transformer": ("gpn_jax.models.transformer", "Transformer", "TransformerConfig"),
    "gdn": ("gpn_jax.models.gdn", "GatedDeltaNet", "GDNConfig"),
}


def model_config(model_cfg):
    """The family's frozen dataclass config built from a ConfigDict / dict with a `family` key."""
    fields = dict(model_cfg)
    family = fields.pop("family", "gpn")
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; choose one of {sorted(FAMILIES)}")
    module, model_cls, config_cls = FAMILIES[family]
    mod = importlib.import_module(module)
    cls = getattr(mod, config_cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"unknown field(s) {unknown} for model family {family!r}")
    return getattr(mod, model_cls), cls(**fields)


def build_model(model_cfg):
    """Model object (see `gpn_jax.models.base.LanguageModel`) for a config's `model` block."""
    model_cls, cfg = model_config(model_cfg)
    return model_cls(cfg)
