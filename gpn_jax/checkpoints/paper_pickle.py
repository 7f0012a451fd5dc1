"""The paper's public code's checkpoint pickle <-> our parameters.

Its trainer pickles `{'step', 'data_position', 'params', 'opt_state'}` with numpy leaves, where
`params` is the flat dict of its Flax modules (`sot_m` for GPN+M, `sot` for GPN) and `opt_state`
is the state of `optax.chain(clip_by_global_norm, adamw(..., mask))` over that dict. We map names
both ways; optimiser moments (any dict keyed by parameter names) are renamed the same way, so a
run can continue from the paper's checkpoint with our trainer
(`--config.train.init_from=paper:<checkpoint.pkl>`, `gpn_jax.training.init_from`).

One parameter is not a rename: the paper keeps the SwiGLU gate and up projections in one
(d, 2F) matrix `ffn_w1_k` = [gate | up]; we keep them as `w1` (gate) and `w3` (up), each
(d, F), so that tensor parallelism splits them together (`gpn_jax.core.mlp`). They are
concatenated on the way out and split on the way in (moments alike).

Loading never runs code from the file: `load` unpickles with `_PaperUnpickler`, which admits
only the globals the paper trainer's pickle holds (numpy arrays, dtypes and scalars, a few
inert builtins, the optax state classes of its optimiser) and refuses any other.
"""

import builtins
import codecs
import importlib
import math
import os
import pickle
import re
import struct

import jax
import numpy as np
import optax

from gpn_jax.io.regular import open_regular

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


def _numpy_internal(module: str, name: str):
    """numpy's pickle helpers live in `numpy._core` (2.x) or `numpy.core` (1.x); pickles of
    either name the writer's. Resolved from this numpy, without its `numpy.core` shim warning."""
    for prefix in ("numpy._core.", "numpy.core."):
        try:
            return getattr(importlib.import_module(prefix + module), name)
        except (ImportError, AttributeError):
            continue
    raise AttributeError(f"numpy has no {module}.{name}")


_NUMERIC_KINDS = "biufc"  # bool, signed, unsigned, float, complex: never objects or records
_DTYPE_SPEC = re.compile(r"[<>|=]?[A-Za-z][A-Za-z0-9]{0,15}")


class _Budget:
    """What one load may allocate: the pickle's own size (its arrays and bytes are in the
    file, so a pickle that asks for more is hostile, e.g. a 40-byte `bytearray(2**31-1)`)."""

    def __init__(self, limit: int):
        self.limit = limit

    def take(self, nbytes: int, what: str) -> None:
        if not 0 <= nbytes <= self.limit:
            raise _Refused(f"{what} of {nbytes} bytes (the file has {self.limit})")
        self.limit -= nbytes


def _is_flag(value) -> bool:
    """numpy pickles a dtype as `dtype(spec, 0, 1)` (align, copy: ints or bools)."""
    return isinstance(value, (bool, int, np.bool_, np.integer)) and value in (0, 1)


def _checked_dtype(*args, **kwargs) -> np.dtype:
    """A numeric dtype from a pickle's arguments: a spec and at most the align / copy flags.
    Strings are limited to a type code or name ('f4', '<f4', 'float32'): numpy parses anything
    longer (comma lists, subarrays) with `ast.literal_eval`, whose errors would escape as
    SyntaxError; a flag that is not 0 / 1 would reach numpy's deprecation warnings."""
    spec = args[0] if args else kwargs.get("dtype")
    if isinstance(spec, str) and not _DTYPE_SPEC.fullmatch(spec):
        raise _Refused(f"numpy.dtype {spec[:40]!r} (only a numeric type code or name is data)")
    flags = [*args[1:], *(v for k, v in kwargs.items() if k != "dtype")]
    if len(args) > 3 or set(kwargs) - {"dtype", "align", "copy"} or not all(map(_is_flag, flags)):
        raise _Refused(f"numpy.dtype arguments {flags!r:.60} (only the align / copy flags 0 / 1)")
    try:
        dtype = np.dtype(*args, **kwargs)
    except (TypeError, ValueError, SyntaxError) as e:
        raise _Refused(f"numpy.dtype {spec!r:.60} ({type(e).__name__})") from None
    if dtype.kind not in _NUMERIC_KINDS:
        raise _Refused(f"numpy.dtype {dtype.str!r} (only numeric dtypes are data)")
    return dtype


def _nbytes(shape, dtype) -> int:
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if not all(isinstance(n, int) and n >= 0 for n in shape):
        raise _Refused(f"array shape {shape!r}")
    return math.prod(shape) * _checked_dtype(dtype).itemsize


def _allowed_globals(budget: _Budget) -> dict:
    """Every global the paper trainer's pickle can name (pickle protocols 2-5, numpy 1.x and
    2.x), found by listing the globals of such pickles; each only builds data, and each that
    allocates is charged to `budget`. Maps (module, name) -> this process's object."""

    def ndarray(shape, dtype=float, *args, **kwargs):
        budget.take(_nbytes(shape, dtype), "numpy.ndarray")
        return np.ndarray(shape, _checked_dtype(dtype), *args, **kwargs)

    def reconstruct(subtype, shape, dtype):
        if subtype is not ndarray:
            raise _Refused(f"numpy _reconstruct of {subtype!r}")
        budget.take(_nbytes(shape, dtype), "numpy._reconstruct")
        return _numpy_internal("multiarray", "_reconstruct")(np.ndarray, shape, dtype)

    def sized(cls):
        def make(arg=b"", *rest):
            if isinstance(arg, int):
                budget.take(arg, f"builtins.{cls.__name__}")
            return cls(arg, *rest)

        return make

    def encode(text, encoding="latin1"):
        if encoding not in ("latin1", "latin-1"):
            raise _Refused(f"_codecs.encode with codec {encoding!r}")
        return codecs.encode(text, encoding)

    allowed = {("numpy", "ndarray"): ndarray, ("numpy", "dtype"): _checked_dtype}
    for pkg in ("numpy._core", "numpy.core"):
        allowed[(f"{pkg}.multiarray", "_reconstruct")] = reconstruct
        for sub, name in (("multiarray", "scalar"), ("numeric", "_frombuffer")):
            allowed[(f"{pkg}.{sub}", name)] = _numpy_internal(sub, name)
    # Protocol 2 writes bytes through `_codecs.encode`; inert builtin containers and scalars.
    allowed[("_codecs", "encode")] = encode
    allowed[("builtins", "bytearray")] = sized(bytearray)
    for name in ("set", "frozenset", "complex"):
        allowed[("builtins", name)] = getattr(builtins, name)
    return allowed


# The states of chain(clip_by_global_norm, adamw(schedule, mask=...)). optax moves its classes
# between private modules across versions, so any optax module is accepted and the name is
# resolved to this optax's public class.
_OPTAX_STATES = (
    "EmptyState",
    "ClipByGlobalNormState",
    "ScaleByAdamState",
    "MaskedState",
    "ScaleByScheduleState",
)


def _plain_dtype_state(state) -> bool:
    return (
        isinstance(state, tuple)
        and len(state) == 8
        and state[0] == 3
        and state[1] in ("<", ">", "|", "=")
        and state[2:] == (None, None, None, -1, -1, 0)
    )


def _check_array_state(state, budget: "_Budget") -> None:
    """An ndarray's pickled state: (version, shape, numeric dtype, fortran, raw bytes)."""
    ok = isinstance(state, tuple) and len(state) == 5 and isinstance(state[2], np.dtype)
    if ok and isinstance(state[4], bytes | bytearray):
        nbytes = _nbytes(state[1], state[2])
        if nbytes == len(state[4]):
            budget.take(nbytes, "numpy array state")
            return
    raise _Refused(f"numpy array state {str(state)[:80]}")


class _Capped:
    """A file whose `read(n)` never asks for more than is left: a buffered read allocates
    the `n` it is given before finding the file shorter (a 4-byte length of 1.6 GB would)."""

    def __init__(self, f, size: int):
        self._f, self._size = f, size

    def read(self, n: int = -1) -> bytes:
        left = max(0, self._size - self._f.tell())
        return self._f.read(left if n is None or n < 0 else min(n, left))

    def readline(self) -> bytes:
        return self._f.readline()

    def readinto(self, b) -> int:
        return self._f.readinto(b)


class _Refused(pickle.UnpicklingError):
    def __init__(self, global_name: str):
        super().__init__(global_name)
        self.global_name = global_name


class _PaperUnpickler(pickle._Unpickler):  # noqa: SLF001 - see the docstring
    """An unpickler that builds data only: `find_class` (the sole way a pickle reaches code)
    answers the allow-listed globals above and refuses everything else. The pure-Python
    unpickler, whose memo is a dict: the C one sizes its memo array by the largest index a
    `LONG_BINPUT` names, so four hostile bytes could make it allocate gigabytes."""

    def __init__(self, file, size: int):
        super().__init__(file)
        self._budget = _Budget(size)
        self._allowed = _allowed_globals(self._budget)
        self.dispatch = dict(pickle._Unpickler.dispatch)  # noqa: SLF001
        self.dispatch[pickle.BUILD[0]] = type(self)._load_build
        self.dispatch[pickle.BYTEARRAY8[0]] = type(self)._load_bytearray8

    def _load_bytearray8(self):
        """BYTEARRAY8, its length charged to the budget before the bytearray is made."""
        (n,) = struct.unpack("<Q", self.read(8))
        self._budget.take(n, "a pickled bytearray")
        b = bytearray(n)
        if self.readinto(b) != n:
            raise EOFError("truncated bytearray")
        self.append(b)

    def _load_build(self):
        """BUILD (`obj.__setstate__(state)`), checked for numpy's two stateful types: a dtype
        takes only the state numpy writes for a plain numeric dtype, an array only raw bytes
        of exactly its shape's size (numpy would otherwise allocate what the state claims)."""
        state, obj = self.stack[-1], self.stack[-2]
        if isinstance(obj, np.dtype) and not _plain_dtype_state(state):
            raise _Refused(f"numpy.dtype state {str(state)[:80]}")
        if isinstance(obj, np.ndarray):
            _check_array_state(state, self._budget)
        pickle._Unpickler.load_build(self)  # noqa: SLF001

    def find_class(self, module: str, name: str):
        if (module, name) in self._allowed:
            return self._allowed[(module, name)]
        if (module == "optax" or module.startswith("optax.")) and name in _OPTAX_STATES:
            return getattr(optax, name, optax.EmptyState)
        raise _Refused(f"global {module + '.' + name!r}")

    def persistent_load(self, pid):
        raise _Refused(f"persistent id {str(pid)[:40]!r}")


# What a malformed pickle raises while being read (each a data error, never a bug of ours).
_UNREADABLE = (
    pickle.UnpicklingError,
    EOFError,
    AttributeError,
    ImportError,
    TypeError,
    ValueError,
    IndexError,
    KeyError,
    OverflowError,
    RecursionError,
    MemoryError,
    UnicodeDecodeError,
    OSError,
    SystemError,  # numpy's __setstate__ on some malformed states
    struct.error,  # a length field cut short
)


def read_pickle(path: str):
    """Unpickles `path` with `_PaperUnpickler`; a refused global or a bad file is one ValueError."""
    if os.path.isdir(path):
        raise ValueError(f"{path} is a directory, not a paper checkpoint pickle")
    try:
        f, size = open_regular(path)  # a FIFO or device is refused, not read
        with f:
            return _PaperUnpickler(_Capped(f, size), size).load()
    except _Refused as e:
        what = " ".join(e.global_name.split())[:200]
        raise ValueError(f"refusing to load {path}: {what} is not allowed") from None
    except FileNotFoundError:
        raise ValueError(f"paper checkpoint not found: {path}") from None
    except IsADirectoryError:
        raise ValueError(f"{path} is a directory, not a paper checkpoint pickle") from None
    except _UNREADABLE as e:
        detail = " ".join(str(e).split())[:200] or type(e).__name__
        raise ValueError(f"{path} is not a readable paper checkpoint ({detail})") from None


def load(path: str) -> dict:
    """Reads the paper trainer's `checkpoint.pkl` (or the directory holding it) into our layout.

    Returns {'params', 'opt_state', 'step', 'data_position'}. Safe on untrusted files: see
    `read_pickle`; anything but the paper's layout is one ValueError naming the file.
    """
    if os.path.isdir(path):
        path = os.path.join(path, "checkpoint.pkl")
    ckpt = _checked(read_pickle(path), path)
    try:
        params = from_paper_params(ckpt["params"])
        opt_state = _map_param_dicts(ckpt["opt_state"], from_paper_params)
    except (ValueError, TypeError, KeyError, IndexError) as e:
        detail = " ".join(str(e).split())[:200] or type(e).__name__
        raise ValueError(f"{path} is not a paper checkpoint: {detail}") from None
    return {
        "params": params,
        "opt_state": opt_state,
        "step": ckpt["step"],
        "data_position": ckpt["data_position"],
    }


def _checked(ckpt, path: str) -> dict:
    """`ckpt` if it has the paper trainer's layout; else a one-line ValueError."""

    def bad(why: str):
        return ValueError(f"{path} is not a paper checkpoint: {why}")

    if not isinstance(ckpt, dict):
        raise bad(f"a {type(ckpt).__name__}, not a dict")
    if not all(isinstance(k, str) for k in ckpt):
        raise bad(
            f"a key that is not a string ({next(k for k in ckpt if not isinstance(k, str))!r})"
        )
    missing = {"params", "opt_state", "step", "data_position"} - set(ckpt)
    if missing:
        raise bad(f"missing {sorted(missing)}")
    for key in ("step", "data_position"):
        value = ckpt[key]
        if isinstance(value, np.integer) and value.ndim == 0:
            value = ckpt[key] = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise bad(f"its {key} is {value!r}, not a non-negative integer")
    params = ckpt["params"]
    if not isinstance(params, dict) or not params:
        raise bad("its params are not a non-empty dict")
    for name, leaf in params.items():
        if not isinstance(name, str) or not name:
            raise bad(f"parameter name {name!r} is not a string")
        if not isinstance(leaf, np.ndarray) or leaf.dtype.kind not in _NUMERIC_KINDS:
            raise bad(f"parameter {name!r} is a {type(leaf).__name__}, not a numeric array")
    return ckpt
