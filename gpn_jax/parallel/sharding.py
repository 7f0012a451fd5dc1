"""Parameter and optimiser-state shardings: each leaf's logical axes -> mesh axes.

Model families declare a logical axis name per dimension of each parameter
(`model.param_axes()`, e.g. `{'layer_0/w1': ('embed', 'ffn')}`; see `gpn_jax.models.params`);
this module knows no parameter names. `Rules.axes` maps each logical name to a mesh axis
(or to None: never split):

* `embed` -> `fsdp`: storage of a matrix split along its model-width dimension (ZeRO-3
  style). The model computes with parameters gathered over `fsdp` once per step
  (`gpn_jax.parallel.spmd`).
* `ffn` -> `tensor`: d_ffn, Megatron style (column-parallel gate / up, row-parallel down).
* `heads` -> `tensor`: whole memory / attention heads; each head's memory on one device.
* `vocab` -> `tensor`: the embedding's rows / the untied LM head's columns.

A leaf of a train state (`params/layer_0/w1`, `opt_state/1/0/mu/layer_0/w1`) takes the axes
of the parameter whose path is its suffix, so optimiser moments follow their parameters.
`Rules.overrides` (config regexes over leaf paths, first match wins) come before the
declared axes. A logical axis is dropped (that dimension replicated) when its mesh axis has
size 1, does not divide the dimension, or does not divide the model size it stands for
(`model.axis_sizes()`: heads must split whole, d_ffn evenly), so one declaration serves
every mesh. Leaves with no declared axes: matrices are sharded over `fsdp` on their first
divisible dimension, vectors and scalars are replicated.
"""

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import jax
from jax import P
from jax.sharding import NamedSharding

FSDP, TENSOR = "fsdp", "tensor"
MESH_AXES = ("data", FSDP, TENSOR)
DEFAULT_AXIS_RULES = (("embed", FSDP), ("ffn", TENSOR), ("heads", TENSOR), ("vocab", TENSOR))


@dataclasses.dataclass(frozen=True)
class Rules:
    """How leaves become PartitionSpecs: `axes` ((logical name, mesh axis or None), ...) and
    `overrides` ((regex over the leaf path, spec or None), ...) tried first."""

    axes: tuple = DEFAULT_AXIS_RULES
    overrides: Sequence[tuple[str, tuple | None]] = ()

    def mesh_axis(self, name: str) -> str | None:
        """The mesh axis a logical name maps to; a mesh axis name maps to itself."""
        return dict(self.axes).get(name, name)


DEFAULT_RULES = Rules()


class Layout(NamedTuple):
    """What a model family declares: {param path: logical axes}, {logical axis: model size}."""

    axes: Mapping[str, tuple]
    sizes: Mapping[str, int]


def layout_of(model) -> Layout:
    """The model's declared layout (see `gpn_jax.models.base.LanguageModel.param_axes`)."""
    return Layout(model.param_axes(), model.axis_sizes())


def logical_splits(rules: Rules, mesh_shape: Mapping[str, int]) -> dict[str, tuple[str, int]]:
    """{logical axis: (mesh axis, size)} for the logical axes `rules` actually split on a mesh
    of `mesh_shape` (what `model.partitioned` takes)."""
    return {
        name: (axis, mesh_shape[axis])
        for name, axis in rules.axes
        if isinstance(axis, str) and mesh_shape.get(axis, 1) > 1
    }


def leaf_path(path) -> str:
    return jax.tree_util.keystr(path, simple=True, separator="/")


def _names(entry) -> tuple:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple | list) else (entry,)


def _entry(axes: tuple):
    return None if not axes else axes[0] if len(axes) == 1 else axes


def _trim(entries: list) -> P:
    while entries and entries[-1] is None:
        entries.pop()
    return P(*entries)


def fit_spec(
    spec, shape, mesh_shape: Mapping[str, int], sizes: Mapping | None = None, rules=DEFAULT_RULES
) -> P:
    """The mesh PartitionSpec for a logical `spec` on an array of `shape` (see the module doc)."""
    if spec is None or len(spec) != len(shape):
        return P()
    sizes = sizes or {}
    used, out = set(), []
    for entry, dim in zip(spec, shape, strict=True):
        axes = []
        for name in _names(entry):
            axis = rules.mesh_axis(name)
            n = mesh_shape.get(axis, 1) if axis else 1
            model_size = sizes.get(name)
            if n == 1 or axis in used or (model_size and model_size % n):
                continue
            axes.append(axis)
        if axes and dim % math.prod(mesh_shape[a] for a in axes):
            axes = []
        used.update(axes)
        out.append(_entry(tuple(axes)))
    return _trim(out)


def _fallback(shape, mesh_shape) -> tuple | None:
    """Unmatched leaves: matrices over fsdp on the first divisible dimension, else replicated."""
    n = mesh_shape.get(FSDP, 1)
    if len(shape) < 2 or n == 1:
        return None
    for i, dim in enumerate(shape):
        if dim % n == 0:
            return tuple(FSDP if j == i else None for j in range(len(shape)))
    return None


def _declared(path: str, axes: Mapping[str, tuple]):
    """The logical axes of the parameter whose path is a ('/'-aligned) suffix of `path`."""
    parts = path.split("/")
    for i in range(len(parts)):
        found = axes.get("/".join(parts[i:]))
        if found is not None:
            return found
    return None


def spec_for(path: str, shape, mesh_shape, rules: Rules = DEFAULT_RULES, layout=None) -> P:
    """The PartitionSpec of one leaf: a config override, else the declared axes, else fallback."""
    sizes = layout.sizes if layout else None
    for pattern, spec in rules.overrides:
        if re.search(pattern, path):
            return fit_spec(spec, shape, mesh_shape, sizes, rules)
    spec = _declared(path, layout.axes) if layout else None
    if spec is None:
        spec = _fallback(shape, mesh_shape)
    return fit_spec(spec, shape, mesh_shape, sizes, rules)


def tree_specs(tree, mesh, layout: Layout | None = None, rules: Rules | None = None):
    """PartitionSpec for every array leaf of `tree` (arrays or ShapeDtypeStructs)."""
    mesh_shape, rules = dict(mesh.shape), rules or DEFAULT_RULES
    return jax.tree_util.tree_map_with_path(
        lambda p, x: spec_for(leaf_path(p), x.shape, mesh_shape, rules, layout), tree
    )


def tree_shardings(tree, mesh, layout: Layout | None = None, rules: Rules | None = None):
    """NamedSharding for every leaf of `tree` (train state, params, optimiser state)."""
    specs = tree_specs(tree, mesh, layout, rules)
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=is_spec)


def without_axis(spec: P, axis: str) -> P:
    """`spec` with mesh axis `axis` removed from every entry (gathered over `axis`)."""
    return _trim([_entry(tuple(a for a in _names(e) if a != axis)) for e in spec])


def axis_dim(spec: P, axis: str) -> int | None:
    """The dimension `spec` splits over mesh axis `axis`, or None."""
    for i, entry in enumerate(spec):
        if axis in _names(entry):
            return i
    return None


def is_spec(x) -> bool:
    return isinstance(x, P)


def rules_from_config(mesh_cfg) -> Rules:
    """`config.mesh.axis_rules` ({logical axis: mesh axis, '' for never split}) over the
    defaults, and `config.mesh.rules` (a list of [regex, spec] pairs; spec a list of logical /
    mesh axis names or None per dimension, or None for replicated) as overrides."""
    get = (lambda k: mesh_cfg.get(k, None)) if hasattr(mesh_cfg, "get") else (lambda k: None)
    axes = dict(DEFAULT_AXIS_RULES)
    given = get("axis_rules") or {}
    if not hasattr(given, "items"):
        raise ValueError(
            f"config.mesh.axis_rules must map logical axes to mesh axes, got {given!r}; "
            "set one with --config.mesh.axis_rules.<axis>=<data|fsdp|tensor or ''>"
        )
    for name, axis in dict(given).items():
        if axis is not None and not isinstance(axis, str):
            raise ValueError(f"config.mesh.axis_rules.{name}={axis!r}: a mesh axis name or ''")
        if axis and axis not in MESH_AXES:
            raise ValueError(
                f"config.mesh.axis_rules.{name}={axis!r} is not a mesh axis; use one of "
                f"{', '.join(MESH_AXES)} or '' (never split)"
            )
        axes[name] = axis or None
    parsed = []
    for pattern, spec in get("rules") or ():
        re.compile(pattern)
        if spec is not None:
            for name in (n for e in spec for n in _names(e)):
                if name not in axes and name not in MESH_AXES:
                    raise ValueError(f"unknown axis {name!r} in sharding rule {pattern!r}")
        parsed.append((pattern, None if spec is None else tuple(_freeze(e) for e in spec)))
    return Rules(tuple(axes.items()), tuple(parsed))


def _freeze(e):
    return tuple(e) if isinstance(e, list | tuple) else e
