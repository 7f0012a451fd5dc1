"""The files of one orbax checkpoint step as this package lays it out: what a finalized step
always holds, and its JSON read as untrusted data (a wrong type is damage, `failures.Damaged`).
"""

import json
import os
import stat
from typing import Any

import jax
from etils import epath

from gpn_jax.checkpoints import failures
from gpn_jax.io import paths
from gpn_jax.io.regular import NotRegularFileError, read_regular_file

# What a finalized orbax step of this layout always holds; any missing means an incomplete
# step (orbax itself only checks the commit marker on object stores).
JSON_FILE = "metadata"  # where JsonCheckpointHandler keeps an item's JSON
REQUIRED_PARTS = (
    "_CHECKPOINT_METADATA",
    "commit_success.txt",
    "state/_METADATA",
    "state/manifest.ocdbt",
    "data",
    # `checksums` too, but a step saved before checksums has none (it is restored unverified)
    *(f"{item}/{JSON_FILE}" for item in ("config", "meta")),
)


MAX_JSON_BYTES = 64 << 20  # an item's JSON, a checksum record: KiBs; more is not ours


def read_bytes(path: epath.Path, max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of the regular file `path`, at most `max_bytes`; Damaged for a FIFO, device,
    directory or an oversized file (a local step holds none), FileNotFoundError if absent.
    An object store (`gs://`) has only objects: read as they are, after a size check."""
    if paths.is_remote(os.fspath(path)):
        if path.stat().length > max_bytes:
            raise failures.Damaged(f"{path} is larger than the {max_bytes} bytes expected")
        return path.read_bytes()
    try:
        return read_regular_file(path, max_bytes)
    except NotRegularFileError as e:
        raise failures.Damaged(str(e)) from None


def read_json(path: epath.Path) -> Any:
    """The JSON in `path` (UnicodeDecodeError / JSONDecodeError for a garbled one, Damaged for
    a special or oversized file: damage)."""
    return json.loads(read_bytes(path).decode("utf-8"))


def check_tree(step_dir: epath.Path) -> None:
    """Damaged unless every entry under the local step directory is a directory or a regular
    file, or a symlink to one that stays inside the step: what orbax and tensorstore open next
    then cannot block (a FIFO) or read without end (a link to /dev/zero)."""
    root = os.fspath(step_dir)
    if paths.is_remote(root):
        return  # an object store holds objects only
    real_root = os.path.realpath(root)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            full = os.path.join(folder, name)
            mode = os.lstat(full).st_mode
            if stat.S_ISLNK(mode):
                target = os.path.realpath(full)
                if os.path.commonpath([real_root, target]) != real_root:
                    raise failures.Damaged(f"{full} is a link that leaves the step")
                mode = os.stat(full).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise failures.Damaged(f"{full} is not a regular file or directory")


def saved_items(step_dir: epath.Path) -> set[str]:
    """The item names a step's `_CHECKPOINT_METADATA` says orbax saved (empty if unreadable:
    that file's own damage is reported where it is read)."""
    try:
        meta = read_json(step_dir / "_CHECKPOINT_METADATA")
    except (OSError, ValueError):
        return set()
    handlers = meta.get("item_handlers") if isinstance(meta, dict) else None
    return set(handlers) if isinstance(handlers, dict) else set()


def json_item(value: Any, where: str) -> dict:
    """`value` if a JSON object; else Damaged (a config, meta or data state of `[]`)."""
    if not isinstance(value, dict):
        raise failures.Damaged(f"{where} is a JSON {type(value).__name__}, not an object")
    return value


def grain_file(process_index: int) -> str:
    """The file Grain's handler keeps a host's iterator state in."""
    return f"process_{process_index}-of-{jax.process_count()}.json"


def check_step_metadata(directory: str) -> None:
    """A one-line CheckpointError naming the first step whose `_CHECKPOINT_METADATA` is JSON
    of the wrong type, or not a regular file (a FIFO, a link to a device): orbax reads every
    step's when a manager opens the directory and fails (or blocks) on such a file (an
    unparsable one it skips, and restore then finds the step's damage)."""
    from gpn_jax.io.errors import CheckpointError

    root = epath.Path(directory)
    if not root.exists():
        return
    for step_dir in sorted(root.iterdir()):
        path = step_dir / "_CHECKPOINT_METADATA"
        if not step_dir.name.isdigit() or not path.exists():
            continue
        try:  # orbax reads it next, in its own threads: a FIFO would hang them
            value = read_json(path)
        except (ValueError, UnicodeDecodeError):
            continue
        except failures.Damaged as e:
            raise CheckpointError(
                f"{e}: step {step_dir.name} is damaged; move {step_dir} aside (e.g. to "
                f"{step_dir}.unreadable-0) and rerun"
            ) from None
        if not isinstance(value, dict):
            raise CheckpointError(
                f"{path} is a JSON {type(value).__name__}, not an object: step {step_dir.name} "
                f"is damaged; move {step_dir} aside (e.g. to {step_dir}.unreadable-0) and rerun"
            )
