"""Output folders the tool marks as its own, so writing into one never deletes a user's file.

A folder the tool writes holds a marker, `.gpn_jax-outputs.json`:

    {"format": "gpn_jax-outputs", "version": 1, "files": ["README.md", "config.json", ...]}

listing every file the tool wrote there. Writing into an existing folder replaces only the
files of the new set and removes only files the old marker lists; anything else inside (a
user's NOTES.md, a .git/ folder) is left alone. A file the tool is about to write whose
name is already taken by a file no marker lists is refused, even with --overwrite: the
tool never replaces what it did not write.
"""

import json
import os
import shutil
import tempfile
from collections.abc import Callable

from gpn_jax.io.files import atomic_write
from gpn_jax.io.regular import NotRegularFileError, read_regular_file

MARKER = ".gpn_jax-outputs.json"
FORMAT, VERSION = "gpn_jax-outputs", 1
_MAX_MARKER_BYTES = 1 << 20


def owned_files(folder: str) -> list[str] | None:
    """The file names the marker of `folder` lists (plain names only), or None if it has no
    readable marker (a folder the tool did not create, or an older export)."""
    try:
        record = json.loads(read_regular_file(os.path.join(folder, MARKER), _MAX_MARKER_BYTES))
    except (OSError, NotRegularFileError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        return None
    files = record.get("files")
    if not isinstance(files, list):
        return None
    return [f for f in files if isinstance(f, str) and _plain(f)]


def _plain(name: str) -> bool:
    return (
        name not in ("", ".", "..", MARKER) and os.path.basename(name) == name and "\0" not in name
    )


def write_owned(out: str, write: Callable[[str], None], owned: list[str] | None) -> None:
    """Runs `write(folder)` into a fresh temporary sibling of `out`, then moves its files into
    `out` under the marker.

    A new `out` is the temporary folder renamed (never seen half-written), with the mode the
    user's umask gives a new folder. An existing `out` (an empty one too: the user's folder,
    its mode, group and inode, is kept) gets the new files one by one (each an atomic rename);
    the files `owned` (what an earlier marker, or an older export's known layout, lists) that
    the new set lacks are removed; nothing else there is touched.

    Raises:
        ValueError: a file to write is named like a file of `out` the tool did not write.
    """
    out = os.path.abspath(out)
    parent, name = os.path.split(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    try:
        write(tmp)
        new = sorted(os.listdir(tmp))
        _write_marker(tmp, new)
        if not os.path.lexists(out):
            os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's is private; a new folder is not
            os.rename(tmp, out)  # fails if `out` appeared meanwhile with files in it
            return
        _merge(tmp, out, new, owned or [])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _merge(tmp: str, out: str, new: list[str], owned: list[str]) -> None:
    """Moves `new` from `tmp` into the non-empty `out`, as `write_owned` says."""
    for f in new:
        dst = os.path.join(out, f)
        if os.path.lexists(dst) and f not in owned:
            raise ValueError(
                f"{dst} exists and was not written by gpn_jax; move it away or give another "
                "output directory (nothing was changed)"
            )
    for f in new:
        os.replace(os.path.join(tmp, f), os.path.join(out, f))
    for f in sorted(set(owned) - set(new)):
        path = os.path.join(out, f)
        if os.path.isfile(path) and not os.path.islink(path):
            os.remove(path)
    os.replace(os.path.join(tmp, MARKER), os.path.join(out, MARKER))


def _write_marker(folder: str, files: list[str]) -> None:
    record = {"format": FORMAT, "version": VERSION, "files": files}
    atomic_write(os.path.join(folder, MARKER), json.dumps(record, indent=2).encode())
