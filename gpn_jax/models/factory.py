"""Builds a model object from the `model` block of an ml_collections config, and declares each
model family once (`Family`): what code outside `models/` knows of it.

`config.model.family` picks the family; every other field goes to that family's frozen
config dataclass, so an unknown field is a clear error rather than a silent no-op. The models
the experiments compare are a family's variants (`gpn_m` and `gpn` are GPN with and without its
memory), each with its labels and its block at a comparison's common width (`Width`), matched
to GPN+M's parameter count by `matched` (the synthetic suite, the recall sweep).
"""

import dataclasses
import importlib
from collections.abc import Callable
from typing import NamedTuple

from gpn_jax.models import configs

DEFAULT = "gpn"  # a model block without `family` (older exports and configs)


class Width(NamedTuple):
    """A comparison's common size: GPN+M sets the parameter budget at `width` (d_emb width/2,
    d_ffn `ffn_mult` x width, `heads` memory heads of width/(2 heads) x width/heads)."""

    width: int
    vocab: int
    max_len: int  # the longest sequence (Transformer++'s max_seq_len)
    heads: int = 2
    ffn_mult: float = 2.0
    gdn_layers: int = 2
    transformer_layers: int = 2
    gdn_chunk: int = 64
    loss_chunk: int = 64


@dataclasses.dataclass(frozen=True)
class Variant:
    """A model the experiments compare: a family with `fields` set."""

    key: str  # its name in experiment configs and result files (`gpn_m`)
    label: str  # its name in tables
    title: str  # its full name (model cards)
    fields: tuple[tuple[str, object], ...] = ()


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family. The config class lives in the JAX-free `gpn_jax.models.configs` (each
    model module re-exports its own); the model module is imported lazily, so families stay
    independent and loading a config never imports JAX."""

    name: str  # `model.family`
    module: str
    model_class: str
    config_class: str
    recurrent: bool  # carries a fixed-size state from token to token and window to window
    variants: tuple[Variant, ...]
    at_width: Callable[[Width], dict]  # its block at a comparison's width, before matching


def _gpn(s: Width) -> dict:
    w, h = s.width, s.heads
    return dict(family="gpn", vocab_size=s.vocab, d_model=w, d_emb=w // 2,
                d_ffn=max(8, round(s.ffn_mult * w / 8) * 8), n_heads=h,
                d_key=max(w // (2 * h), 1), d_value=max(w // h, 1), loss_chunk=s.loss_chunk)  # fmt: skip


def _transformer(s: Width) -> dict:
    return dict(family="transformer", vocab_size=s.vocab, d_model=s.width,
                n_layers=s.transformer_layers, n_heads=2, d_ffn=2 * s.width,
                max_seq_len=s.max_len, loss_chunk=s.loss_chunk)  # fmt: skip


def _gdn(s: Width) -> dict:
    w = s.width
    return dict(family="gdn", vocab_size=s.vocab, d_model=w, n_layers=s.gdn_layers, n_heads=2,
                d_key=max(w // 4, 1), d_value=max(w // 2, 1), d_ffn=2 * w,
                chunk_size=s.gdn_chunk, loss_chunk=s.loss_chunk)  # fmt: skip


FAMILIES = {
    f.name: f
    for f in (
        Family("gpn", "gpn_jax.models.gpn", "GPN", "GPNConfig", True, (
            Variant("gpn_m", "GPN+M", "Grounded Prediction Network with memory"),
            Variant("gpn", "GPN", "Grounded Prediction Network",
                    (("memory", False), ("n_heads", 0), ("d_key", 0), ("d_value", 0))),
        ), _gpn),
        Family("transformer", "gpn_jax.models.transformer", "Transformer", "TransformerConfig",
               False, (Variant("transformer", "Transformer++", "Transformer++"),), _transformer),
        Family("gdn", "gpn_jax.models.gdn", "GatedDeltaNet", "GDNConfig", True, (
            Variant("gdn", "Gated DeltaNet", "Gated DeltaNet"),
            Variant("gdn_neg", "Gated DeltaNet, β ∈ [0, 2]",
                    "Gated DeltaNet with negative eigenvalues",
                    (("negative_eigenvalues", True),)),
        ), _gdn),
    )
}  # fmt: skip
VARIANTS = {v.key: (f, v) for f in FAMILIES.values() for v in f.variants}
REFERENCE = "gpn_m"  # the variant whose count the others are matched to


def family_name(model_cfg) -> str:
    """The `family` of a model block (ConfigDict / dict), `DEFAULT` where it names none."""
    return model_cfg.get("family", DEFAULT)


def family(model_cfg) -> Family:
    """The `Family` record of a model block; an unknown family is a ValueError."""
    return FAMILIES[_split(model_cfg)[0]]


def variant(model_cfg) -> Variant:
    """The variant a model block is: the family's variant whose first field it sets as the
    variant does (`gpn`: memory=False), else the family's first."""
    fam, fields = family(model_cfg), dict(model_cfg)
    marked = [v for v in fam.variants[1:] if fields.get(v.fields[0][0]) == v.fields[0][1]]
    return marked[0] if marked else fam.variants[0]


def label(key: str) -> str:
    """Variant `key`'s label in tables; the key itself where it names no variant."""
    return VARIANTS[key][1].label if key in VARIANTS else key


def variant_keys(text: str) -> list[str]:
    """The comma-separated variant keys of `text`, each checked (a one-line ValueError)."""
    keys = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in VARIANTS]
    if unknown or not keys:
        raise ValueError(f"unknown models {unknown or keys}; choose from {','.join(VARIANTS)}")
    return keys


def at_width(key: str, size: Width) -> dict:
    """Variant `key`'s model block at `size`, before matching."""
    fam, v = VARIANTS[key]
    return fam.at_width(size) | dict(v.fields)


def n_params(fields: dict) -> int:
    from gpn_jax.models import accounting

    return accounting.param_counts(build_model(fields))["total"]


def match_ffn(fields: dict, target: int) -> dict:
    """`fields` with the d_ffn (a multiple of 8) whose parameter count is nearest `target`
    (the count is linear in d_ffn)."""
    a, b = n_params(fields | dict(d_ffn=8)), n_params(fields | dict(d_ffn=16))
    per = (b - a) / 8
    return fields | dict(d_ffn=int(max(8, round((8 + (target - a) / per) / 8) * 8)))


def matched(key: str, size: Width) -> dict:
    """Variant `key`'s block at `size` with the d_ffn whose count is nearest GPN+M's there."""
    fields = at_width(key, size)
    if key == REFERENCE:
        return fields
    return match_ffn(fields, n_params(at_width(REFERENCE, size)))


def _split(model_cfg) -> tuple[str, dict]:
    """(family, the other fields) of a ConfigDict / dict; an unknown family is a ValueError."""
    fields = dict(model_cfg)
    name = fields.pop("family", DEFAULT)
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; choose one of {sorted(FAMILIES)}")
    return name, fields


def family_config(model_cfg):
    """The family's frozen dataclass config built from a ConfigDict / dict with a `family` key
    (no JAX import: experiment configs call this while loading)."""
    name, fields = _split(model_cfg)
    unknown = sorted(set(fields) - config_fields(model_cfg))
    if unknown:
        raise ValueError(f"unknown field(s) {unknown} for model family {name!r}")
    return getattr(configs, FAMILIES[name].config_class)(**fields)


def config_fields(model_cfg) -> frozenset:
    """The field names a model block's family config takes."""
    cls = getattr(configs, family(model_cfg).config_class)
    return frozenset(f.name for f in dataclasses.fields(cls))


def model_config(model_cfg):
    """(model class, `family_config`) of a config's `model` block; imports the family's module."""
    cfg = family_config(model_cfg)
    fam = family(model_cfg)
    return getattr(importlib.import_module(fam.module), fam.model_class), cfg


def build_model(model_cfg):
    """Model object (see `gpn_jax.models.base.LanguageModel`) for a config's `model` block."""
    model_cls, cfg = model_config(model_cfg)
    return model_cls(cfg)
