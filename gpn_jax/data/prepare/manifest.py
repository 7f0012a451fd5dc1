"""The prepared corpus's manifest (written last) and its progress file (while preparing).

`<output>/manifest.json` lists, per split ('train', 'heldout'), the shard files with their
token and document counts; the token dtype; the tokenizer file and its sha256; the document
separator (eos after every document, so document starts are the positions after an eos);
the source; the settings that determine the bytes; and the exact command. `bin:<output>`
training reads it (`read_prepared`). `<output>/progress.json` holds the same settings plus
where reading and each split's writer stand, and is removed once the manifest exists.
"""

import dataclasses
import json
import os
import re

from gpn_jax.io import lock, paths, untrusted
from gpn_jax.io.files import atomic_write

MANIFEST = "manifest.json"
PROGRESS = "progress.json"
TOKENIZER = "tokenizer.model"
SPLITS = ("train", "heldout")
FORMAT = "gpn_jax.prepare/1"
# Marks an output directory as gpn-prepare's own; only a marked (or new, or empty) directory
# is written into. Files in it that gpn-prepare does not write are never touched.
MARKER = ".gpn_prepare"


def write_json(path: str, obj: dict) -> None:
    """Atomically (temporary file + rename)."""
    atomic_write(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def read_json(path: str) -> dict | None:
    """The JSON object in `path` (None if there is none); untrusted: one `BadFileError` line
    if it is not a JSON object (`io.untrusted.read_json`)."""
    if not os.path.lexists(path):
        return None
    fix = "delete the output directory (or use a new --output) and prepare again"
    value = untrusted.read_json(path, fix=fix)
    if not isinstance(value, dict):
        raise untrusted.bad_file(path, "not a JSON object", fix)
    return value


def claim_output(output: str, overwrite: bool = False) -> None:
    """Makes `output` gpn-prepare's own directory: created and marked if missing or empty,
    used as is if marked (with `overwrite`, emptied of what gpn-prepare wrote there first:
    `clear_output`). An existing unmarked folder that holds anything is refused (one line),
    unless it holds a finished manifest (a corpus prepared before the marker existed), which
    `check_output` then only reads."""
    os.makedirs(output, exist_ok=True)
    marker = os.path.join(output, MARKER)
    if os.path.isfile(marker) and not os.path.islink(marker):
        if overwrite:
            clear_output(output)
        return
    entries = [e for e in os.listdir(output) if e != lock.LOCK_FILE]  # held by this run
    if not entries:
        atomic_write(marker, b'{"tool": "gpn-prepare"}\n')
        return
    if MANIFEST not in entries or overwrite:
        raise ValueError(
            f"{output} holds files that gpn-prepare did not write (no {MARKER} marker; e.g. "
            f"{sorted(entries)[0]!r:.80}); use a new or empty --output"
        )


_SHARD = re.compile(r"^data_\d{4,}\.bin(\.partial)?$")


def clear_output(output: str) -> list[str]:
    """Removes what gpn-prepare writes in its marked `output` (the manifest, the progress file,
    the tokenizer, the split directories' shards and temporaries); anything else stays."""
    removed = []
    for d in (output, *(os.path.join(output, s) for s in SPLITS)):
        if not os.path.isdir(d) or os.path.islink(d):
            continue
        for name in os.listdir(d):
            ours = (
                _SHARD.search(name)
                or paths.is_temporary(name)
                or (d == output and name in (MANIFEST, PROGRESS, TOKENIZER))
            )
            path = os.path.join(d, name)
            if ours and (os.path.isfile(path) or os.path.islink(path)):
                os.remove(path)
                removed.append(path)
    return removed


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
    if progress is not None:
        _check_progress(os.path.join(output, PROGRESS), progress)
    if saved is not None and saved != settings:
        if manifest is None and not any(w["shards"] for w in progress["writers"].values()):
            return None, None  # an earlier attempt finished no shard: start afresh
        raise ValueError(
            f"{output} holds another corpus's shards (different "
            f"{', '.join(differences(saved, settings))}); use a new --output, or --overwrite to "
            "replace what gpn-prepare wrote there"
        )
    if manifest is None and progress is None and _has_shards(output):
        raise ValueError(
            f"{output} holds .bin shards that this command did not write (no {MANIFEST} or "
            f"{PROGRESS}); use a new --output or delete it"
        )
    return manifest, progress


def _check_progress(path: str, progress: dict) -> None:
    """The writers' part of a progress file, the part read before the settings are compared."""
    writers = progress.get("writers")
    ok = isinstance(writers, dict) and all(
        isinstance(w, dict) and isinstance(w.get("shards"), list) for w in writers.values()
    )
    if not ok:
        raise untrusted.bad_file(
            path, "writers is not an object of {shards: [...]} records",
            "delete the output directory (or use a new --output) and prepare again",
        )  # fmt: skip


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


_FIX = "re-run gpn-prepare into a new --output"
_DTYPES = ("uint16", "uint32")  # the token dtypes gpn-prepare writes (bin_source.BIN_DTYPES)


def read_prepared(directory: str) -> PreparedCorpus | None:
    """The prepared corpus in `directory`, or None if it has no manifest (plain shards).

    The manifest is untrusted: every field is checked against a schema (dtype from an
    allow-list, names that stay inside `directory`, counts that agree with the shard files'
    sizes) before any shard is opened; a bad one is one `BadFileError` line naming it.
    """
    path = os.path.join(directory, MANIFEST)
    if not os.path.isdir(directory) or not os.path.lexists(path):
        return None
    m = untrusted.read_json(path, fix=_FIX)
    _expect(path, m, dict, "the manifest")
    if m.get("format") != FORMAT:
        raise untrusted.bad_file(path, f"not a {FORMAT} manifest", _FIX)
    dtype = m.get("dtype")
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise untrusted.bad_file(
            path, f"dtype {dtype!r:.40} is not one of {', '.join(_DTYPES)}", _FIX
        )
    splits = _expect(path, m.get("splits"), dict, "splits")
    itemsize = 2 if dtype == "uint16" else 4
    files = {s: _split_files(directory, path, splits.get(s), s, itemsize) for s in SPLITS}
    tok = _expect(path, m.get("tokenizer"), dict, "tokenizer")
    sha = tok.get("sha256")
    if not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
        raise untrusted.bad_file(path, "tokenizer.sha256 is not a sha256 hex digest", _FIX)
    sep = _expect(path, m.get("document_separator"), dict, "document_separator")
    eos = sep.get("id")
    if not isinstance(eos, int) or isinstance(eos, bool) or not 0 <= eos < 2 ** (8 * itemsize):
        raise untrusted.bad_file(path, f"document_separator.id {eos!r:.40} is not a token id", _FIX)
    tok_file = untrusted.inside(directory, tok.get("file"), source=path, field="tokenizer.file")
    if not os.path.isfile(tok_file):
        raise untrusted.bad_file(path, f"tokenizer.file {tok['file']!r:.200} is missing", _FIX)
    return PreparedCorpus(directory, dtype, files["train"], files["heldout"], tok_file, sha, eos)


def _expect(path: str, value, kind: type, what: str):
    if not isinstance(value, kind):
        name = {dict: "an object", list: "a list"}[kind]
        raise untrusted.bad_file(path, f"{what} is not {name}", _FIX)
    return value


def _split_files(directory: str, path: str, split, name: str, itemsize: int) -> list[str]:
    """The shard paths of one split, each a regular file inside `directory` whose size is its
    recorded token count x `itemsize`."""
    split = _expect(path, split, dict, f"splits.{name}")
    out = []
    for i, shard in enumerate(_expect(path, split.get("shards"), list, f"splits.{name}.shards")):
        field = f"splits.{name}.shards[{i}]"
        shard = _expect(path, shard, dict, field)
        file = untrusted.inside(directory, shard.get("file"), source=path, field=f"{field}.file")
        tokens = shard.get("tokens")
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
            raise untrusted.bad_file(path, f"{field}.tokens {tokens!r:.40} is not a count", _FIX)
        if not os.path.isfile(file):
            raise untrusted.bad_file(path, f"{field}.file {shard['file']!r} is missing", _FIX)
        size = os.path.getsize(file)
        if size != tokens * itemsize:
            raise untrusted.bad_file(
                file, f"{size} bytes, but {MANIFEST} records {tokens} tokens ({tokens * itemsize} "
                "bytes)", _FIX)  # fmt: skip
        out.append(file)
    return out
