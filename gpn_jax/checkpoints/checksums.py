"""Per-leaf checksums saved with each checkpoint step and verified on restore.

A checksum is computed on the device, over each array's bytes: the array is viewed as
unsigned words (bf16 as uint16, f32 as uint32, ...), each word is mixed with its flat index
(MurmurHash3's 32-bit finaliser, two independently seeded lanes), and the mixed words are
summed modulo 2**32. The sum of integers is exact and order-free, so the checksum is the same
whatever the array's sharding or the number of hosts, and no array leaves its device (a small
array whose every shard is in this CPU process, or whose whole replica is, as a replicated
array's on each CPU host of a multi-host run, is hashed by the same arithmetic in numpy: it is
already in host memory, and a tiny model's tree then needs no compiled program; large arrays
hash several times faster compiled). Any
change of one word changes a lane's sum unless the mixer maps two words to the same value
with the same index (a bijection: never) or a multi-word change cancels (chance 2**-64 over
both lanes).

The JSON items (config, meta, data position) are covered by a sha256 of their canonical
JSON (sorted keys), so a hand-edited or swapped item (`{}` in place of the data position) is
damage too. The record is the step's `checksums` item, written by orbax with the step:

    {"format": "gpn_jax-checksums", "version": 1,
     "leaves": {"['params']['w']": {"dtype": "float32", "shape": [4, 6], "hash": "<16 hex>"}},
     "json": {"config": "<sha256>", "meta": "<sha256>", "data": "<sha256>"},
     "step": 2}

Leaves are compared by their path's names alone (`leaf_name`): a trainer's `TrainState`
writes `.params['w']`, a parameters-only reader restores `['params']['w']`, and both are
the leaf `params/w`. A restored leaf the record does not name is damage, never skipped. The
`step` (absent from records of older saves) must equal the step directory's name.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gpn_jax.checkpoints import step_files
from gpn_jax.checkpoints.failures import Damaged

FORMAT, VERSION = "gpn_jax-checksums", 1
_SEEDS = (0x9E3779B9, 0x7F4A7C15)
_HEX16 = re.compile(r"[0-9a-f]{16}")
_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}


def _fmix32(h, xp=jnp):
    """MurmurHash3's 32-bit finaliser: a bijection on uint32 with full avalanche (`xp`: jnp
    or numpy, whose uint32 arithmetic wraps alike)."""
    h = h ^ (h >> xp.uint32(16))
    h = h * xp.uint32(0x85EBCA6B)
    h = h ^ (h >> xp.uint32(13))
    h = h * xp.uint32(0xC2B2AE35)
    return h ^ (h >> xp.uint32(16))


def _words(x) -> jax.Array:
    """`x`'s bytes as a flat uint32 vector (narrower words zero-extended)."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    words = jax.lax.bitcast_convert_type(x, _UINT[x.dtype.itemsize])
    return jnp.ravel(words).astype(jnp.uint32)


def _lanes(w, xp=jnp):
    """(2,) uint32: the two lanes over the flat uint32 words `w`."""
    idx = xp.arange(w.size, dtype=xp.uint32)
    mixed = [_fmix32(w ^ _fmix32(idx + xp.uint32(seed), xp), xp) for seed in _SEEDS]
    return xp.stack([xp.sum(m, dtype=xp.uint32) for m in mixed])


def _leaf_hash(x) -> jax.Array:
    """(2,) uint32: the two lanes of `x`'s checksum, on `x`'s devices."""
    return _lanes(_words(x))


def _host_words(x: jax.Array) -> np.ndarray:
    """`_words(x)` in numpy, for an array already in this CPU process's memory (`_local`)."""
    x = _local(x)
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    a = np.ascontiguousarray(np.asarray(x))
    a = a.astype(np.uint8) if a.dtype == np.bool_ else a
    if a.dtype.itemsize == 8:  # as XLA's bitcast to uint32: each word's two halves, low first
        a = a.view("<u4")
    return a.view(f"<u{a.dtype.itemsize}").ravel().astype(np.uint32)


def _host_hash(x: jax.Array) -> np.ndarray:
    """`_leaf_hash(x)` computed in numpy."""
    with np.errstate(over="ignore"):  # uint32 arithmetic wraps by design
        return _lanes(_host_words(x), np)


_HOST_WORDS = 2**18  # above this a leaf is hashed compiled: numpy's passes cost more than XLA's


def _local(x: jax.Array) -> jax.Array:
    """`x` itself if this process holds every shard of it; else this process's replica of a
    replicated `x` (every host of a multi-host run holds the whole value)."""
    return x if x.is_fully_addressable else x.addressable_shards[0].data


def _in_host_memory(x: jax.Array) -> bool:
    """`x` is small and all of it is in this process, on the CPU (every shard, or a whole
    replica): its bytes are already host memory, and hashing them in numpy costs less than
    compiling a program (on a multi-host CPU run, one program per host)."""
    cpu = all(d.platform == "cpu" for d in x.devices())
    whole = x.is_fully_addressable or (
        x.sharding.is_fully_replicated and bool(x.addressable_shards)
    )
    return x.size <= _HOST_WORDS and whole and cpu


@jax.jit
def _tree_hashes(leaves: list) -> list:
    return [_leaf_hash(x) for x in leaves]


def _array_leaves(tree: Any) -> list[tuple[str, Any]]:
    """(path string, array) of every array leaf, in tree order."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    out = []
    for path, leaf in flat:
        if isinstance(leaf, jax.Array | np.ndarray | np.generic):
            out.append((jax.tree_util.keystr(path), jnp.asarray(leaf)))
    return out


def leaf_record(tree: Any) -> dict:
    """{path: {"dtype", "shape", "hash"}} of every array in `tree`."""
    leaves = _array_leaves(tree)
    device = [x for _, x in leaves if not _in_host_memory(x)]
    on_device = iter(jax.device_get(_tree_hashes(device)) if device else ())
    record = {}
    for path, x in leaves:
        h = _host_hash(x) if _in_host_memory(x) else next(on_device)
        dtype = "key" if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else str(x.dtype)
        record[path] = {
            "dtype": dtype,
            "shape": list(x.shape),
            "hash": "".join(f"{int(v):08x}" for v in np.asarray(h)),
        }
    return record


def json_digest(item: Any) -> str:
    """sha256 of `item`'s canonical JSON."""
    return hashlib.sha256(json.dumps(item, sort_keys=True).encode()).hexdigest()


def make(state: Any, items: Mapping[str, Any], step: int | None = None) -> dict:
    """The `checksums` item of step `step` saving `state` and the JSON `items`."""
    record = {
        "format": FORMAT,
        "version": VERSION,
        "leaves": leaf_record(state),
        "json": {name: json_digest(value) for name, value in items.items()},
    }
    return record if step is None else record | {"step": int(step)}


_KEY = re.compile(r"\.(\w+)|\['((?:[^'\\]|\\.)*)'\]|\[\"((?:[^\"\\]|\\.)*)\"\]|\[(\d+)\]")


def leaf_name(path: str) -> str:
    """`.params['w']` and `['params']['w']` -> `params/w`: a leaf's path by its names alone,
    whatever container (NamedTuple attribute, dict key, list index) holds it. A path of
    another form is returned unchanged."""
    names, end = [], 0
    for m in _KEY.finditer(path):
        if m.start() != end:
            return path
        names.append(next(g for g in m.groups() if g is not None))
        end = m.end()
    return "/".join(names) if end == len(path) else path


def validate(record: Any, where: str) -> dict:
    """`record` if it has the schema above; else Damaged naming `where`."""
    ok = (
        isinstance(record, dict)
        and record.get("format") == FORMAT
        and record.get("version") == VERSION
        and isinstance(record.get("leaves"), dict)
        and isinstance(record.get("json"), dict)
        and all(isinstance(v, str) for v in record["json"].values())
        and all(_valid_leaf(v) for v in record["leaves"].values())
        and (type(record.get("step", 0)) is int and record.get("step", 0) >= 0)
    )
    if not ok:
        raise Damaged(f"{where} is not a checksum record")
    return record


def _valid_leaf(v: Any) -> bool:
    return (
        isinstance(v, dict)
        and isinstance(v.get("dtype"), str)
        and isinstance(v.get("shape"), list)
        and all(isinstance(n, int) and n >= 0 for n in v["shape"])
        and isinstance(v.get("hash"), str)
        and _HEX16.fullmatch(v["hash"]) is not None
    )


def verify_step(step: int, record: dict | None, meta: dict, where: str) -> None:
    """Damaged if the step inside (the checksum record's, else the trainer's `meta`) is not
    the directory's name `step`: a copied or renamed step would be resumed as the newest
    and the training since its real step silently lost."""
    for inside, source in (
        ((record or {}).get("step"), "checksum record"),
        (meta.get("step"), "meta"),
    ):
        if type(inside) is int and inside != step:
            raise Damaged(
                f"{where} holds step {inside} (its {source} says so), not the step its "
                "directory name says"
            )


def verify(record: dict, state: Any, items: Mapping[str, Any], where: str) -> None:
    """Damaged naming the first leaf or JSON item of `where` whose checksum differs, or a
    restored leaf the record has no checksum for.

    Only what was restored is checked (a parameters-only restore checks the parameters); a
    leaf restored in another dtype or shape than saved (a deliberate cast) is not compared.
    """
    for name, value in items.items():
        saved = record["json"].get(name)
        if saved is not None and saved != json_digest(value):
            raise Damaged(f"checksum mismatch in {where}: item {name!r} differs from the saved one")
    leaves = {leaf_name(k): v for k, v in record["leaves"].items()}
    for path, got in leaf_record(state).items():
        saved = leaves.get(leaf_name(path))
        if saved is None:
            raise Damaged(f"{where}: array {path} was read but its checksum record lacks it")
        if (saved["dtype"], saved["shape"]) != (got["dtype"], got["shape"]):
            continue
        if saved["hash"] != got["hash"]:
            raise Damaged(f"checksum mismatch in {where}: array {path} differs from the saved one")


# ------------------------------------------------------------------ the step's other files
FILES = "files.json"  # in the step's `checksums` item, written once the step is finalized


def _listed(step_dir) -> list:
    """Every file of a finalized step whose bytes no leaf checksum covers: orbax's metadata
    (`_METADATA`, `_sharding`, `array_metadatas/*`, manifests, item JSON, the leaf checksums),
    not the OCDBT data files under `d/` (their arrays are checked leaf by leaf, their b-tree nodes by CRC-32C)."""
    out, todo = [], [(step_dir, "")]
    while todo:
        folder, prefix = todo.pop()
        for p in sorted(folder.iterdir()):
            rel = prefix + p.name
            if p.is_dir():
                if p.name != "d":
                    todo.append((p, rel + "/"))
            elif not rel.startswith(f"checksums/{FILES}"):
                out.append((rel, p))
    return sorted(out)


def _sha256(path) -> str:
    """sha256 of a step's metadata file (regular, bounded: `step_files.read_bytes`)."""
    return hashlib.sha256(step_files.read_bytes(path)).hexdigest()


def file_record(step_dir) -> dict:
    """{"format", "version", "files": {relative path: sha256}} of a finalized step."""
    files = {rel: _sha256(p) for rel, p in _listed(step_dir)}
    return {"format": FORMAT + "-files", "version": VERSION, "files": files}


def verify_files(step_dir, where: str) -> bool:
    """Damaged if a file recorded in the step's `files.json` is missing or differs (False if
    the step has no such record: a save interrupted before it was written)."""
    path = step_dir / "checksums" / FILES
    if not path.exists():
        return False
    record = step_files.read_json(path)
    ok = (
        isinstance(record, dict)
        and record.get("format") == FORMAT + "-files"
        and isinstance(record.get("files"), dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in record["files"].items())
    )
    if not ok:
        raise Damaged(f"{where} checksums/{FILES} is not a file checksum record")
    present = dict(_listed(step_dir))
    for rel, digest in sorted(record["files"].items()):
        if rel not in present:  # names are only compared, never opened: no path leaves the step
            raise Damaged(f"{where}: {rel} is missing")
        if _sha256(present[rel]) != digest:
            raise Damaged(f"checksum mismatch in {where}: {rel} differs from the saved file")
    return True
