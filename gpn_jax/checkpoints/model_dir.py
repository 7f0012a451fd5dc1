"""A trained model as a self-contained directory (Hugging Face style), and loading it back.

    <dir>/model.safetensors   every parameter, named by its path in the nested params dict
                              joined with '.' (params['layer_0']['w1'] -> 'layer_0.w1'),
                              in the dtype training kept it in
    <dir>/config.json         {"format", "gpn_jax_version", "family", "step", "tokens_seen",
                              "tokenizer_file", "tokenizer_sha256", "model", "config"}: the
                              run's whole ml_collections config under "config" (its data block
                              lets evaluation rebuild the held-out split), the model block again
                              under "model" for readers that only want the architecture
    <dir>/tokenizer.model     the SentencePiece model (absent for runs without one, e.g. recall)
    <dir>/README.md           a model card (`gpn_jax.checkpoints.model_card`)
    <dir>/.gpn_jax-outputs.json  the files the export wrote (`checkpoints.owned_dir`): a
                              re-export replaces only those, never a user's file there

config.json also records the sha256 of every tensor's bytes ("tensor_sha256") and of every
file the loader reads ("files_sha256": model.safetensors, tokenizer.model), checked on
load: a flipped byte, or two same-shape tensors whose offsets were swapped in the header,
is refused. An export made before these digests loads with one warning.

Loading needs neither orbax nor the training workdir. A directory whose tensors disagree
with its config (missing, extra or mis-shaped tensor) or whose tokenizer is not the one
recorded is refused with one line: those are the mistakes a hand-assembled or half-copied
directory makes, and they would otherwise surface as a shape error deep in a jit.
"""

import hashlib
import json
import logging
import math
import os

import jax
import ml_collections
import numpy as np

from gpn_jax.checkpoints import owned_dir
from gpn_jax.checkpoints.restore import RestoredRun
from gpn_jax.configs import blocks
from gpn_jax.data.tokenizer import load_tokenizer
from gpn_jax.io.files import atomic_write, sha256_file
from gpn_jax.io.provenance import package_version
from gpn_jax.io.regular import NotRegularFileError, open_regular, read_regular_file
from gpn_jax.models import factory
from gpn_jax.models import params as params_lib
from gpn_jax.models.accounting import abstract_params
from gpn_jax.models.bounds import check_model_size

WEIGHTS, CONFIG, TOKENIZER, CARD = (
    "model.safetensors",
    "config.json",
    "tokenizer.model",
    "README.md",
)
FORMAT = "gpn_jax"
LAYOUT = (WEIGHTS, CONFIG, TOKENIZER, CARD)  # what an export before markers wrote
log = logging.getLogger(__name__)


def tensor_sha256(value) -> str:
    """sha256 of a tensor's bytes as safetensors stores them (C order, little-endian)."""
    return hashlib.sha256(np.ascontiguousarray(np.asarray(value)).tobytes()).hexdigest()


def flatten(params: dict, prefix: str = "") -> dict:
    """{'layer_0': {'w1': x}} -> {'layer_0.w1': x} (keys sorted, so the file is deterministic)."""
    flat = {}
    for key in sorted(params):
        if "." in key:
            raise ValueError(f"parameter name {prefix + key!r} contains '.', the path separator")
        value = params[key]
        if isinstance(value, dict):
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[prefix + key] = value
    return flat


def unflatten(flat: dict) -> dict:
    """The inverse of `flatten`."""
    return params_lib.nest(flat, sep=".")


def make_record(run: RestoredRun) -> dict:
    """The config.json record of `run` (a `load_run` result)."""
    config = run.config.to_dict()
    tok = run.tokenizer
    return {
        "format": FORMAT,
        "gpn_jax_version": package_version(),
        "family": factory.family_name(config["model"]),
        "step": int(run.step),
        "tokens_seen": int(run.step) * config["train"]["batch_size"] * config["train"]["seq_len"],
        "tokenizer_file": TOKENIZER if tok is not None else None,
        "tokenizer_sha256": hashlib.sha256(tok.model_proto).hexdigest() if tok else None,
        "model": config["model"],
        "config": config,
        "source_workdir": os.path.realpath(run.workdir),
    }


def exported_from(model_dir: str) -> str | None:
    """The run directory `model_dir` was exported from, if it is an export that records one."""
    try:
        record = read_record(model_dir)
    except (ValueError, OSError):
        return None
    source = record.get("source_workdir")
    return source if isinstance(source, str) else None


def tool_files(out: str) -> list[str] | None:
    """The files of `out` the export wrote: its marker's list, else (an export made before
    markers) the known layout if its config.json is an export's; None for a foreign folder."""
    owned = owned_dir.owned_files(out)
    if owned is None and exported_from(out) is not None:
        owned = [f for f in LAYOUT if os.path.isfile(os.path.join(out, f))]
    return owned


def save_model_dir_atomic(run, out: str, record: dict, card: str) -> dict:
    """`save_model_dir` into a temporary sibling of `out`, then moved into `out`
    (`owned_dir.write_owned`: only the export's own files there are replaced). Returns the
    config.json record written (with its digests)."""
    written = {}

    def write(folder: str) -> None:
        written.update(save_model_dir(run, folder, record, card))

    owned_dir.write_owned(out, write, tool_files(out) if os.path.isdir(out) else None)
    return written


def save_model_dir(run: RestoredRun, out: str, record: dict, card: str) -> dict:
    """Writes `run` to `out` as the module docstring lays out; returns config.json's record."""
    from safetensors.flax import save_file

    os.makedirs(out, exist_ok=True)
    tensors = {k: np.asarray(v) for k, v in flatten(jax.device_get(run.params)).items()}
    save_file({k: jax.numpy.asarray(v) for k, v in tensors.items()}, os.path.join(out, WEIGHTS))
    files = {WEIGHTS: sha256_file(os.path.join(out, WEIGHTS))}
    if run.tokenizer is not None:
        atomic_write(os.path.join(out, TOKENIZER), run.tokenizer.model_proto)
        files[TOKENIZER] = sha256_file(os.path.join(out, TOKENIZER))
    record = record | {
        "tensor_sha256": {k: tensor_sha256(v) for k, v in tensors.items()},
        "files_sha256": files,
    }
    atomic_write(os.path.join(out, CONFIG), json.dumps(record, indent=2, sort_keys=True).encode())
    atomic_write(os.path.join(out, CARD), card.encode())
    return record


_MAX_CONFIG_BYTES = 16 << 20  # a config.json is a few KiB; more is not one of ours
_MAX_HEADER_BYTES = 100 << 20  # safetensors' own cap on a header
# safetensors dtype names -> bytes per element: what a model's parameters can be stored in
_DTYPES = {
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2),
    "BF16": ("bfloat16", 2), "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2),
    "I8": ("int8", 1), "U64": ("uint64", 8), "U32": ("uint32", 4), "U16": ("uint16", 2),
    "U8": ("uint8", 1), "BOOL": ("bool", 1),
}  # fmt: skip


def _refuse(path: str, what: str, fix: str = "re-export it with gpn_jax.export") -> ValueError:
    return ValueError(f"{path}: {what}; {fix}")


def read_record(model_dir: str) -> dict:
    """config.json of a model directory, checked against the schema `make_record` writes;
    anything else is a one-line ValueError naming the file."""
    path = os.path.join(model_dir, CONFIG)
    if not os.path.isfile(path):
        raise ValueError(f"{model_dir} is not a model directory: no {CONFIG}")
    try:
        raw = read_regular_file(path, _MAX_CONFIG_BYTES)
    except NotRegularFileError as e:
        raise _refuse(path, f"not a model config ({e})") from None
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise _refuse(path, f"not valid JSON ({' '.join(str(e).split())[:120]})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise _refuse(path, 'not written by gpn_jax.export (no "format": "gpn_jax")')
    config = record.get("config")
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise _refuse(path, "lacks the run config and its model block")
    if not isinstance(config.get("data", {}), dict):
        raise _refuse(path, "its config's data block is not an object")
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise _refuse(path, f"its step is {step!r}, not a non-negative integer")
    _check_tokenizer_fields(record, path)
    for field in ("tensor_sha256", "files_sha256"):
        digests = record.get(field, {})
        if not isinstance(digests, dict) or not all(
            isinstance(v, str) and len(v) == 64 for v in digests.values()
        ):
            raise _refuse(path, f"its {field} is not a map of names to sha256 digests")
    return record


def verify_digests(model_dir: str, record: dict, tensors: dict) -> None:
    """ValueError naming the first file or tensor whose sha256 is not the recorded one; an
    export made before digests is warned about and used."""
    if "tensor_sha256" not in record:
        log.warning("%s records no tensor digests (an older export): not verified", model_dir)
        return
    fix = "the file was changed or damaged; copy it again or re-export the model"
    for name, want in sorted(record.get("files_sha256", {}).items()):
        if name != WEIGHTS:  # the tokenizer is checked where it is read (`tokenizer_path`)
            continue
        got = sha256_file(os.path.join(model_dir, name))
        if got != want:
            raise _refuse(os.path.join(model_dir, name), f"sha256 {got[:12]}... is not the "
                          f"{want[:12]}... {CONFIG} records", fix)  # fmt: skip
    want = record["tensor_sha256"]
    for name in sorted(tensors):
        if tensor_sha256(tensors[name]) != want.get(name):
            raise _refuse(os.path.join(model_dir, WEIGHTS), f"tensor {name!r} is not the "
                          f"tensor {CONFIG} records (its sha256 differs)", fix)  # fmt: skip


def _check_tokenizer_fields(record: dict, path: str) -> None:
    """`tokenizer_file` is null or a plain file name in the directory, with its sha256."""
    name = record.get("tokenizer_file")
    if name is None:
        return
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or not name.isprintable()
        or os.path.basename(name) != name
        or "\\" in name
        or "\0" in name
    ):
        raise _refuse(path, f"tokenizer_file {name!r} is not a file name inside the directory")
    digest = record.get("tokenizer_sha256")
    if not isinstance(digest, str) or len(digest) != 64:
        raise _refuse(path, f"tokenizer_sha256 {str(digest)[:80]!r} is not a sha256")


def read_header(path: str) -> dict:
    """{name: (shape, dtype str)} from model.safetensors' header, checked against the file's
    size before anything is allocated: a truncated or hostile file is one ValueError."""
    fix = "copy the file again or re-export the model"
    f, size = open_regular(path)  # a FIFO or device is refused, not read
    with f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or n > min(size - 8, _MAX_HEADER_BYTES):
            raise _refuse(path, f"truncated or not a safetensors file ({size} bytes)", fix)
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            raise _refuse(path, "its header is not valid JSON", fix) from None
    if not isinstance(header, dict):
        raise _refuse(path, "its header is not a JSON object", fix)
    header.pop("__metadata__", None)
    data_size, found = size - 8 - n, {}
    for name, entry in header.items():
        shape, dtype, nbytes, span = _tensor_entry(entry)
        if shape is None or span[1] > data_size or span[1] - span[0] != nbytes:
            raise _refuse(path, f"tensor {name!r} lies outside the file (truncated?)", fix)
        found[name] = (shape, dtype)
    return found


def read_tensors(path: str, expected: dict) -> dict:
    """{name: array} of model.safetensors at `path`, once its header (checked against the
    file's size) names exactly the tensors `expected` ({name: (shape, dtype)}) describes."""
    from safetensors import safe_open

    check_tensors(expected, read_header(path), path)  # before any tensor is read
    try:
        with safe_open(path, framework="flax") as f:
            return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - no iter
    except Exception as e:  # noqa: BLE001 - safetensors' own error type: a bad file
        raise _refuse(path, f"unreadable ({' '.join(str(e).split())[:120]})") from None


def _tensor_entry(entry) -> tuple:
    """(shape, numpy dtype name, byte count, (begin, end)) of a header entry; shape None if
    the entry is malformed."""
    bad = (None, None, 0, (0, 0))
    if not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str):
        return bad
    if entry["dtype"] not in _DTYPES:
        return bad
    shape, span = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not isinstance(span, list) or len(span) != 2:
        return bad
    if not all(type(v) is int and v >= 0 for v in [*shape, *span]) or span[0] > span[1]:
        return bad
    dtype, itemsize = _DTYPES[entry["dtype"]]
    return tuple(shape), dtype, math.prod(shape) * itemsize, tuple(span)


def check_tensors(expected: dict, found: dict, path: str = WEIGHTS) -> None:
    """Raises a one-line ValueError naming the first (sorted) tensor that differs.

    Args:
      expected, found: {name: (shape tuple, dtype str)} from the config and from the file.
    """
    for name in sorted(set(expected) | set(found)):
        if name not in found:
            raise ValueError(f"{path} disagrees with {CONFIG}: missing tensor {name!r}")
        if name not in expected:
            raise ValueError(f"{path} disagrees with {CONFIG}: extra tensor {name!r}")
        if expected[name] != found[name]:
            raise ValueError(
                f"{path} disagrees with {CONFIG}: tensor {name!r} is "
                f"{found[name][1]}{list(found[name][0])}, the config implies "
                f"{expected[name][1]}{list(expected[name][0])}"
            )


def check_finite(tensors: dict, path: str) -> None:
    """A one-line ValueError naming the first (sorted) floating tensor holding a NaN or an
    infinity: damaged weights are refused, never used to generate."""
    for name in sorted(tensors):
        value = np.asarray(tensors[name])
        if np.issubdtype(value.dtype, np.floating) or value.dtype.name == "bfloat16":
            if not np.isfinite(value.astype(np.float32)).all():
                fix = "re-export it from a healthy checkpoint"
                raise _refuse(path, f"tensor {name!r} holds NaN or Inf values", fix)


def tokenizer_path(model_dir: str, record: dict) -> str | None:
    """The directory's tokenizer file, refused if it leaves the directory (a symlink too) or
    is not the one config.json records; None for a model without one."""
    if not record.get("tokenizer_file"):
        return None
    path = os.path.join(model_dir, record["tokenizer_file"])  # a plain name: `read_record`
    if os.path.dirname(os.path.realpath(path)) != os.path.realpath(model_dir):
        raise ValueError(f"{path} leaves {model_dir}; re-export the model")
    if not os.path.isfile(path):
        raise ValueError(f"{model_dir} lacks {record['tokenizer_file']!r}, which {CONFIG} records")
    got = sha256_file(path)
    if got != record.get("tokenizer_sha256"):
        raise ValueError(
            f"{path} has sha256 {got[:12]}..., {CONFIG} records "
            f"{str(record.get('tokenizer_sha256'))[:12]}...: not the model's tokenizer"
        )
    return path


def load_model_dir(model_dir: str) -> RestoredRun:
    """A model directory as `load_run` returns a workdir: config, model, params, tokenizer.

    `config.data.tokenizer_path` points at the directory's tokenizer, so evaluation rebuilds
    the held-out data with it; `workdir` is the model directory.
    """

    model_dir = os.path.abspath(model_dir)
    record = read_record(model_dir)
    config = blocks.complete(ml_collections.ConfigDict(record["config"]))  # an older export's too
    try:
        check_model_size(config.model)  # the trainer's bounds, before anything is built
        model = factory.build_model(config.model)
        shapes = abstract_params(model)  # inside: a NaN or float size fails here, one line
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        detail = " ".join(str(e).split())[:160] or type(e).__name__
        raise _refuse(
            os.path.join(model_dir, CONFIG), f"its model block is invalid ({detail})"
        ) from None
    expected = {k: (tuple(v.shape), str(v.dtype)) for k, v in flatten(shapes).items()}
    path = os.path.join(model_dir, WEIGHTS)
    if not os.path.isfile(path):
        raise ValueError(f"{model_dir} is not a model directory: no {WEIGHTS}")
    tensors = read_tensors(path, expected)
    verify_digests(model_dir, record, tensors)
    check_finite(tensors, path)
    tok_path = tokenizer_path(model_dir, record)
    tokenizer = load_tokenizer(tok_path) if tok_path else None
    # The held-out data is rebuilt with the directory's tokenizer, never a path config.json names.
    config.data.tokenizer_path = tokenizer.path if tokenizer is not None else ""
    device = jax.local_devices()[0]
    params = jax.device_put(unflatten(tensors), device)
    return RestoredRun(config, model, params, tokenizer, int(record["step"]), model_dir)


def load_either(workdir: str | None, model_dir: str | None, step: int | None) -> RestoredRun:
    """What `--workdir` (a training run) or `--model_dir` (an export) of an entry point names."""
    from gpn_jax.checkpoints.restore import load_run

    if bool(workdir) == bool(model_dir):
        raise ValueError("give exactly one of --workdir (a training run) and --model_dir")
    if model_dir:
        if step is not None:
            raise ValueError("--step applies to --workdir only (a model directory holds one step)")
        return load_model_dir(model_dir)
    return load_run(workdir, step)
