"""Parameter and optimiser-state shardings: regex rules over parameter paths -> logical axes.

A rule is `(regex, spec)`: the first regex that `re.search`es a leaf's path (keys joined by
'/', e.g. `params/layer_0/w1` or `opt_state/1/0/mu/layer_0/w1`) gives the leaf's spec, one
entry per array dimension: a logical axis name (`LOGICAL_AXES`), a mesh axis name, or None.
Optimiser moments have their parameter's path as a suffix, so they follow it automatically.

Logical axes and the mesh axis each maps to:

* `fsdp` -> `fsdp`: storage of a matrix split along one dimension (ZeRO-3 style). The model
  computes with parameters gathered over `fsdp` once per step (`gpn_jax.parallel.spmd`).
* `ffn` -> `tensor`: d_ffn, Megatron style: gate `w1` and up `w3` column-parallel, down `w2`
  row-parallel (one reduction per SwiGLU block; see `gpn_jax.core.mlp`).
* `heads` -> `tensor`: memory / attention heads: key, value, query, gate, beta and decay
  projections column-parallel (with their per-head vectors), the output projection `wo`
  row-parallel; each head's memory lives on one device.
* `vocab` -> `tensor`: the embedding's rows / the untied LM head's columns.

A logical axis is dropped (that dimension replicated) when its mesh axis has size 1, does not
divide the dimension, or does not divide the model size it stands for (`model_sizes`: heads
must split whole, d_ffn evenly), so one rule set serves every mesh and model. Leaves no rule
matches: matrices are sharded over `fsdp` on their first divisible dimension, vectors and
scalars are replicated. Square mixing matrices that feed element-wise gates (GPN's `wpg`,
`gate_w`) and GPN's decode/ground projections stay whole on `tensor`.
"""

import math
import re
from collections.abc import Mapping, Sequence

import jax
from jax import P
from jax.sharding import NamedSharding

Rules = Sequence[tuple[str, tuple | None]]

FSDP, TENSOR = "fsdp", "tensor"
LOGICAL_AXES = {"fsdp": FSDP, "ffn": TENSOR, "heads": TENSOR, "vocab": TENSOR}

DEFAULT_RULES: Rules = (
    (r"(^|/)embed$", ("vocab", "fsdp")),  # (V, E)
    (r"(^|/)head$", ("fsdp", "vocab")),  # (d, V)
    (r"(^|/)w[13]$", ("fsdp", "ffn")),  # (d, F) gate, up
    (r"(^|/)w2$", ("ffn", "fsdp")),  # (F, d)
    (r"(^|/)(wq|wk|wv|wg|wrg|wbeta|wa|wb)$", ("fsdp", "heads")),  # (d, H*) column-parallel
    (r"(^|/)conv_[qkv]$", (None, "heads")),  # (W, H*) depthwise filters
    (r"(^|/)(bk|bq|A_log|dt_bias|out_norm)$", ("heads",)),  # (H*) per-head vectors
    (r"(^|/)wo$", ("heads", "fsdp")),  # (H*, d) row-parallel
    (r"(^|/)(proj|fuse|gate_w|wpg)$", ("fsdp", None)),
)


def model_sizes(model_config) -> dict:
    """{logical axis: the model size it must split evenly} from a model config dataclass."""
    get = lambda name: getattr(model_config, name, None)
    return {"heads": get("n_heads"), "ffn": get("d_ffn"), "vocab": get("vocab_size")}


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


def fit_spec(spec, shape, mesh_shape: Mapping[str, int], sizes: Mapping | None = None) -> P:
    """The mesh PartitionSpec for a logical `spec` on an array of `shape` (see the module doc)."""
    if spec is None or len(spec) != len(shape):
        return P()
    sizes = sizes or {}
    used, out = set(), []
    for entry, dim in zip(spec, shape, strict=True):
        axes = []
        for name in _names(entry):
            axis = LOGICAL_AXES.get(name, name)
            n = mesh_shape.get(axis, 1)
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


def spec_for(path: str, shape, mesh_shape, rules: Rules = DEFAULT_RULES, sizes=None) -> P:
    """The PartitionSpec of one leaf."""
    for pattern, spec in rules:
        if re.search(pattern, path):
            return fit_spec(spec, shape, mesh_shape, sizes)
    return fit_spec(_fallback(shape, mesh_shape), shape, mesh_shape, sizes)


def tree_specs(tree, mesh, rules: Rules = DEFAULT_RULES, sizes=None):
    """PartitionSpec for every array leaf of `tree` (arrays or ShapeDtypeStructs)."""
    mesh_shape = dict(mesh.shape)
    return jax.tree_util.tree_map_with_path(
        lambda p, x: spec_for(leaf_path(p), x.shape, mesh_shape, rules, sizes), tree
    )


def tree_shardings(tree, mesh, rules: Rules = DEFAULT_RULES, sizes=None):
    """NamedSharding for every leaf of `tree` (train state, params, optimiser state)."""
    specs = tree_specs(tree, mesh, rules, sizes)
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
    """`config.mesh.rules` (a list of [regex, spec] pairs; spec a list of logical / mesh axis
    names or None per dimension, or None for replicated) placed before the defaults."""
    extra = mesh_cfg.get("rules", None) if hasattr(mesh_cfg, "get") else None
    if not extra:
        return DEFAULT_RULES
    parsed = []
    for pattern, spec in extra:
        re.compile(pattern)
        if spec is not None:
            for name in (n for e in spec for n in _names(e)):
                if name not in LOGICAL_AXES and name not in ("data", FSDP, TENSOR):
                    raise ValueError(f"unknown axis {name!r} in sharding rule {pattern!r}")
        parsed.append((pattern, None if spec is None else tuple(_freeze(e) for e in spec)))
    return tuple(parsed) + tuple(DEFAULT_RULES)


def _freeze(e):
    return tuple(e) if isinstance(e, list | tuple) else e
