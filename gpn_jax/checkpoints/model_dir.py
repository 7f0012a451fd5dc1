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

Loading needs neither orbax nor the training workdir. A directory whose tensors disagree
with its config (missing, extra or mis-shaped tensor) or whose tokenizer is not the one
recorded is refused with one line: those are the mistakes a hand-assembled or half-copied
directory makes, and they would otherwise surface as a shape error deep in a jit.
"""

import hashlib
import json
import os

import jax
import ml_collections

from gpn_jax.checkpoints.restore import RestoredRun
from gpn_jax.data.tokenizer import load_tokenizer
from gpn_jax.io.files import atomic_write
from gpn_jax.io.provenance import package_version
from gpn_jax.models import factory
from gpn_jax.models import params as params_lib
from gpn_jax.models.accounting import abstract_params

WEIGHTS, CONFIG, TOKENIZER, CARD = (
    "model.safetensors",
    "config.json",
    "tokenizer.model",
    "README.md",
)
FORMAT = "gpn_jax"


def file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


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
        "family": config["model"].get("family", "gpn"),
        "step": int(run.step),
        "tokens_seen": int(run.step) * config["train"]["batch_size"] * config["train"]["seq_len"],
        "tokenizer_file": TOKENIZER if tok is not None else None,
        "tokenizer_sha256": hashlib.sha256(tok.model_proto).hexdigest() if tok else None,
        "model": config["model"],
        "config": config,
    }


def save_model_dir(run: RestoredRun, out: str, record: dict, card: str) -> None:
    """Writes `run` to `out` as the module docstring lays out."""
    from safetensors.flax import save_file

    os.makedirs(out, exist_ok=True)
    tensors = flatten(jax.device_get(run.params))
    save_file({k: jax.numpy.asarray(v) for k, v in tensors.items()}, os.path.join(out, WEIGHTS))
    if run.tokenizer is not None:
        atomic_write(os.path.join(out, TOKENIZER), run.tokenizer.model_proto)
    with open(os.path.join(out, CONFIG), "w") as f:
        json.dump(record, f, indent=2, sort_keys=True)
    with open(os.path.join(out, CARD), "w") as f:
        f.write(card)


def read_record(model_dir: str) -> dict:
    """config.json of a model directory, or a one-line ValueError."""
    path = os.path.join(model_dir, CONFIG)
    if not os.path.isfile(path):
        raise ValueError(f"{model_dir} is not a model directory: no {CONFIG}")
    try:
        with open(path) as f:
            record = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    if record.get("format") != FORMAT or "config" not in record:
        raise ValueError(f"{path} was not written by gpn_jax.export")
    return record


def check_tensors(expected: dict, found: dict) -> None:
    """Raises a one-line ValueError naming the first (sorted) tensor that differs.

    Args:
      expected, found: {name: (shape tuple, dtype str)} from the config and from the file.
    """
    for name in sorted(set(expected) | set(found)):
        if name not in found:
            raise ValueError(f"{WEIGHTS} disagrees with {CONFIG}: missing tensor {name!r}")
        if name not in expected:
            raise ValueError(f"{WEIGHTS} disagrees with {CONFIG}: extra tensor {name!r}")
        if expected[name] != found[name]:
            raise ValueError(
                f"{WEIGHTS} disagrees with {CONFIG}: tensor {name!r} is "
                f"{found[name][1]}{list(found[name][0])}, the config implies "
                f"{expected[name][1]}{list(expected[name][0])}"
            )


def _tokenizer(model_dir: str, record: dict):
    """The directory's tokenizer, refused if it is not the one config.json records."""
    if not record.get("tokenizer_file"):
        return None
    path = os.path.join(model_dir, record["tokenizer_file"])
    if not os.path.isfile(path):
        raise ValueError(f"{model_dir} lacks {record['tokenizer_file']}, which {CONFIG} records")
    got = file_sha256(path)
    if got != record.get("tokenizer_sha256"):
        raise ValueError(
            f"{path} has sha256 {got[:12]}..., {CONFIG} records "
            f"{str(record.get('tokenizer_sha256'))[:12]}...: not the model's tokenizer"
        )
    return load_tokenizer(path)


def load_model_dir(model_dir: str) -> RestoredRun:
    """A model directory as `load_run` returns a workdir: config, model, params, tokenizer.

    `config.data.tokenizer_path` points at the directory's tokenizer, so evaluation rebuilds
    the held-out data with it; `workdir` is the model directory.
    """
    from safetensors import safe_open

    model_dir = os.path.abspath(model_dir)
    record = read_record(model_dir)
    config = ml_collections.ConfigDict(record["config"])
    model = factory.build_model(config.model)
    expected = {
        k: (tuple(v.shape), str(v.dtype)) for k, v in flatten(abstract_params(model)).items()
    }
    path = os.path.join(model_dir, WEIGHTS)
    if not os.path.isfile(path):
        raise ValueError(f"{model_dir} is not a model directory: no {WEIGHTS}")
    with safe_open(path, framework="flax") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no iter
    check_tensors(expected, {k: (tuple(v.shape), str(v.dtype)) for k, v in tensors.items()})
    tokenizer = _tokenizer(model_dir, record)
    if tokenizer is not None:
        config.data.tokenizer_path = tokenizer.path
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
