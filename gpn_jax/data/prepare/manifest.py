"""The prepared corpus's manifest (written last) and its progress file (while preparing).

`<output>/manifest.json` lists, per split ('train', 'heldout'), the shard files with their
token and document counts; the token dtype; the tokenizer file and its sha256; the document
separator (eos after every document, so document starts are the positions after an eos);
the source; the settings that determine the bytes; and the exact command. `bin:<output>`
training reads it (`read_prepared`). `<output>/progress.json` holds the same settings plus
where reading and each split's writer stand, and is removed once the manifest exists.
"""

import dataclasses
import hashlib
import json
import os

from gpn_jax.io.files import atomic_write

MANIFEST = "manifest.json"
PROGRESS = "progress.json"
TOKENIZER = "tokenizer.model"
SPLITS = ("train", "heldout")
FORMAT = "gpn_jax.prepare/1"


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_json(path: str, obj: dict) -> None:
    """Atomically (temporary file + rename)."""
    atomic_write(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def read_json(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None


def differences(saved: dict, settings: dict) -> list[str]:
    """The settings keys whose values differ."""
    return sorted(k for k in set(saved) | set(settings) if saved.get(k) != settings.get(k))


def check_output(output: str, settings: dict) -> tuple[dict | None, dict | None]:
    """(manifest, progress) already in `output` for these same `settings`; raises a one-line
    ValueError if `output` holds another corpus (different settings, or shards without a
    manifest or progress file of this tool)."""
    manifest = read_json(os.path.join(output, MANIFEST))
    progress = read_json(os.path.join(output, PROGRESS)) if manifest is None else None
    saved = (manifest or progress or {}).get("settings")
    if saved is not None and saved != settings:
        if manifest is None and not any(w["shards"] for w in progress["writers"].values()):
            return None, None  # an earlier attempt finished no shard: start afresh
        raise ValueError(
            f"{output} holds another corpus's shards (different "
            f"{', '.join(differences(saved, settings))}); use a new --output or delete it"
        )
    if manifest is None and progress is None and _has_shards(output):
        raise ValueError(
            f"{output} holds .bin shards that this command did not write (no {MANIFEST} or "
            f"{PROGRESS}); use a new --output or delete it"
        )
    return manifest, progress


def _has_shards(output: str) -> bool:
    dirs = [output] + [os.path.join(output, s) for s in SPLITS]
    return any(name.endswith(".bin") for d in dirs if os.path.isdir(d) for name in os.listdir(d))


@dataclasses.dataclass(frozen=True)
class PreparedCorpus:
    """What `bin:` training needs from a prepared directory."""

    directory: str
    dtype: str
    train: list[str]
    heldout: list[str]
    tokenizer_path: str
    tokenizer_sha256: str
    eos_id: int


def read_prepared(directory: str) -> PreparedCorpus | None:
    """The prepared corpus in `directory`, or None if it has no manifest (plain shards)."""
    if not os.path.isdir(directory):
        return None
    manifest = read_json(os.path.join(directory, MANIFEST))
    if manifest is None:
        return None
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{directory}/{MANIFEST} is not a {FORMAT} manifest")
    paths = {
        split: [os.path.join(directory, s["file"]) for s in manifest["splits"][split]["shards"]]
        for split in SPLITS
    }
    tok = manifest["tokenizer"]
    return PreparedCorpus(
        directory,
        manifest["dtype"],
        paths["train"],
        paths["heldout"],
        os.path.join(directory, tok["file"]),
        tok["sha256"],
        manifest["document_separator"]["id"],
    )
