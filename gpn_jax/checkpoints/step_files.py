"""The files of one orbax checkpoint step as this package lays it out: what a finalized step
always holds, and its JSON read as untrusted data (a wrong type is damage, `failures.Damaged`).
"""

import json
from typing import Any

import jax
from etils import epath

from gpn_jax.checkpoints import failures

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


def read_json(path: epath.Path) -> Any:
    """The JSON in `path` (UnicodeDecodeError / JSONDecodeError for a garbled one: damage)."""
    return json.loads(path.read_text())


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
