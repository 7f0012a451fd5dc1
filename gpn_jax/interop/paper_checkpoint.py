"""The paper's public code's checkpoint pickle <-> our parameters.

Its trainer pickles `{'step', 'data_position', 'params', 'opt_state'}` with numpy leaves, where
`params` is the flat dict of its Flax modules (`sot_m` for GPN+M, `sot` for GPN) and `opt_state`
is the state of `optax.chain(clip_by_global_norm, adamw(..., mask))` over that dict. We map names
both ways; optimiser moments (any dict keyed by parameter names) are renamed the same way, so a
run can continue from the paper's checkpoint with our trainer.

One parameter is not a rename: the paper keeps the SwiGLU gate and up projections in one
(d, 2F) matrix `ffn_w1_k` = [gate | up]; we keep them as `w1` (gate) and `w3` (up), each
(d, F), so that tensor parallelism splits them together (`gpn_jax.core.mlp`). They are
concatenated on the way out and split on the way in (moments alike).
"""

import os
import pickle

import jax
import numpy as np

# (our group, our name) <-> paper name, for groups shared by both families.
_SHARED = {
    ("embed",): "embedding",
    ("decode", "norm"): "decode_norm_w",
    ("decode", "proj"): "decode_proj_k",
    ("decode", "bias"): "decode_bias",
    ("ground", "emb_norm"): "fuse_norm_w",
    ("ground", "fuse"): "fuse_proj_k",
    ("ground", "gate_norm"): "fg_norm_w",
    ("ground", "gate_w"): "fg_gate_k",
    ("ground", "gate_b"): "fg_gate_b",
    ("write", "norm"): "write_norm_w",
    ("write", "wk"): "write_W_k_k",
    ("write", "bk"): "write_W_k_b",
    ("write", "wv"): "write_W_v_k",
    ("write", "wbeta"): "write_W_beta_k",
    ("write", "wa"): "write_W_a_k",
    ("write", "A_log"): "write_A_log",
    ("write", "dt_bias"): "write_dt_bias",
}
_LAYER = {
    "ffn_norm": "ffn_norm_w",
    "w1": "ffn_w1_k",
    "w2": "ffn_w2_k",
    "pg_norm": "pg_norm_w",
    "wpg": "pg_gate_k",
    "bpg": "pg_gate_b",
    "read_norm": "read_norm_w",
    "wq": "read_W_q_k",
    "bq": "read_W_q_b",
    "wrg": "read_W_gate_k",
    "out_norm": "read_out_norm_w",
    "wo": "read_W_o_k",
}


def _fuse_gate_up(layer: dict) -> dict:
    """Our layer dict -> the paper's: w1 (gate) and w3 (up) become one [gate | up] w1."""
    layer = dict(layer)
    layer["w1"] = np.concatenate([np.asarray(layer["w1"]), np.asarray(layer.pop("w3"))], axis=-1)
    return layer


def _split_gate_up(layer: dict) -> dict:
    """The paper's [gate | up] w1 -> our w1 (gate) and w3 (up)."""
    if "w1" not in layer:
        raise ValueError(f"paper checkpoint layer without {_LAYER['w1']!r}")
    gate, up = np.split(np.asarray(layer["w1"]), 2, axis=-1)
    return dict(layer, w1=gate, w3=up)


def _layers(tree: dict, fn) -> dict:
    return {k: fn(v) if k.startswith("layer_") else v for k, v in tree.items()}


def _paper_name(path: tuple, memory: bool) -> str:
    if path[0].startswith("layer_"):
        # GPN+M (`sot_m`) prefixes every layer's names with L{i}_; GPN (`sot`) has one unprefixed layer.
        prefix = f"L{path[0][len('layer_') :]}_" if memory else ""
        return prefix + _LAYER[path[1]]
    return _SHARED[path]


def _our_path(name: str) -> tuple:
    for path, paper in _SHARED.items():
        if paper == name:
            return path
    layer, _, rest = (
        name.partition("_") if name[0] == "L" and name[1].isdigit() else ("L0", "", name)
    )
    ours = {v: k for k, v in _LAYER.items()}
    if rest not in ours:
        raise ValueError(f"unknown parameter {name!r} in the paper checkpoint")
    return (f"layer_{layer[1:]}", ours[rest])


def to_paper_params(params: dict) -> dict:
    """Our nested params -> the paper's flat dict of numpy arrays."""
    memory = "write" in params
    flat = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(_layers(params, _fuse_gate_up)):
        keys = tuple(k.key for k in path)
        flat[_paper_name(keys, memory)] = np.asarray(leaf)
    return flat


def from_paper_params(flat: dict) -> dict:
    """The paper's flat dict -> our nested params (numpy leaves)."""
    out: dict = {}
    for name, leaf in flat.items():
        path = _our_path(name)
        node = out
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = np.asarray(leaf)
    return _layers(out, _split_gate_up)


def _is_param_dict(x) -> bool:
    return isinstance(x, dict) and ("embedding" in x or "embed" in x)


def _map_param_dicts(tree, fn):
    """Applies `fn` to every parameter-shaped dict inside an optimiser state (tuples, NamedTuples)."""
    return jax.tree.map(lambda x: fn(x) if _is_param_dict(x) else x, tree, is_leaf=_is_param_dict)


def load(path: str) -> dict:
    """Reads the paper trainer's `checkpoint.pkl` (or the directory holding it) into our layout.

    Returns {'params', 'opt_state', 'step', 'data_position'}.
    """
    if os.path.isdir(path):
        path = os.path.join(path, "checkpoint.pkl")
    with open(path, "rb") as f:
        ckpt = pickle.load(f)
    missing = {"params", "opt_state", "step", "data_position"} - set(ckpt)
    if missing:
        raise ValueError(f"{path} is not a paper checkpoint: missing {sorted(missing)}")
    return {
        "params": from_paper_params(ckpt["params"]),
        "opt_state": _map_param_dicts(ckpt["opt_state"], from_paper_params),
        "step": int(ckpt["step"]),
        "data_position": int(ckpt["data_position"]),
    }


def save(path: str, params: dict, opt_state, step: int, data_position: int) -> str:
    """Writes our state in the paper trainer's layout, atomically (tmp file + rename)."""
    if not path.endswith(".pkl"):
        os.makedirs(path, exist_ok=True)
        path = os.path.join(path, "checkpoint.pkl")
    host = jax.device_get
    ckpt = {
        "step": int(step),
        "data_position": int(data_position),
        "params": to_paper_params(host(params)),
        "opt_state": _map_param_dicts(host(opt_state), to_paper_params),
    }
    from gpn_jax.training.paths import atomic_open  # a temporary name unique per host/process

    with atomic_open(path) as f:
        pickle.dump(ckpt, f)
    return path
