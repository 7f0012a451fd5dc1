"""The private cache of compiled C++ kernels: a library is loaded only if this user built it.

`ctypes` runs a shared library's constructors as it loads it, so a cached `.so` is code this
process will execute. The cache therefore trusts nothing it finds:

* It lives under the user's own cache directory (`$GPN_JAX_NATIVE_CACHE`, else
  `$XDG_CACHE_HOME/gpn_jax/native`, else `~/.cache/gpn_jax/native`), created with mode 0700
  and marked as the cache's own (MARKER); a cache directory someone else owns is refused.
  An existing folder that holds anything but is not marked (the user's) is never changed,
  pruned or chmodded: the cache is its marked subfolder SUBFOLDER.
* Each library `<name>.so` has a sidecar `<name>.json` holding its name and sha256, written
  (atomically, after the library is in place) by the build that produced it. A library is
  loaded only if it is a regular file (not a link) owned by the current user, writable by no
  one else, non-empty, and its name and sha256 match the sidecar; anything else (a planted,
  empty, truncated or corrupt file, one without a sidecar, or an entry swapped with another's
  together with its sidecar) is removed and rebuilt, never loaded.
* The compiler is `$CXX` (a command with flags, split like a shell would: `CXX='g++ -O2'`)
  or `c++`, run with a timeout (`$GPN_JAX_CXX_TIMEOUT` seconds, default COMPILE_TIMEOUT_S).
* Entries not used for PRUNE_AFTER_S (each load refreshes its entry's time) and stale
  temporary files are pruned after every build.
"""

import json
import os
import shlex
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gpn_jax.io import files
from gpn_jax.io.regular import open_for_writing, read_regular_file

COMPILE_TIMEOUT_S = 600.0
PRUNE_AFTER_S = 30 * 24 * 3600.0
_STALE_TMP_S = 3600.0
# The file that marks a directory as this cache's own: only a marked directory is pruned or
# made private. An existing folder without it that holds anything is left untouched and the
# cache lives in its subfolder SUBFOLDER instead.
MARKER = ".gpn_jax_kernel_cache"
SUBFOLDER = "gpn_jax_native"


def cache_dir() -> Path:
    """The cache directory (module doc), created 0700 and marked if missing; RuntimeError if
    it is not private to this user."""
    root = os.environ.get("GPN_JAX_NATIVE_CACHE")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "gpn_jax", "native")
    path = _claim(Path(root))
    if path is None:  # a folder of the user's: ours is a marked subfolder of it
        path = _claim(Path(root) / SUBFOLDER)
    if path is None:
        raise RuntimeError(
            f"kernel cache {Path(root) / SUBFOLDER} holds files this cache did not write (no "
            f"{MARKER}); set GPN_JAX_NATIVE_CACHE to a new or empty directory"
        )
    return path


def _claim(path: Path) -> Path | None:
    """`path` if it is (or is now made) this cache's own directory: created here, or empty,
    or already marked; None for a folder that holds anything else (it is left untouched)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise RuntimeError(
            f"kernel cache {path} is not a directory of this user; set GPN_JAX_NATIVE_CACHE "
            "to a private directory"
        )
    marker = path / MARKER
    entries = any(path.iterdir())  # listed before the marker is looked for: a process racing
    if not _private_file(marker):  # to create the cache has marked it before it added files
        if entries:
            return None
        _write_marker(marker)
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)  # ours: make it private (no one else may plant a library)
    return path


def _write_marker(marker: Path) -> None:
    with open_for_writing(marker, text=True) as f:
        f.write("gpn_jax compiled-kernel cache: its .so, .json and .tmp files are pruned.\n")


def compiler() -> list[str]:
    """The C++ compiler command: `$CXX` split like a shell would (flags allowed), else `c++`."""
    try:
        argv = shlex.split(os.environ.get("CXX", "") or "c++")
    except ValueError as e:
        raise RuntimeError(f"cannot parse $CXX ({e})") from None
    exe = shutil.which(argv[0]) if argv else None
    if exe is None:
        raise RuntimeError(f"no C++ compiler ({argv[0] if argv else 'c++'}: $CXX or c++) on PATH")
    return [exe, *argv[1:]]


def _timeout() -> float:
    value = os.environ.get("GPN_JAX_CXX_TIMEOUT", "")
    try:
        return float(value) if value else COMPILE_TIMEOUT_S
    except ValueError:
        raise RuntimeError(f"GPN_JAX_CXX_TIMEOUT must be seconds, got {value!r}") from None


def compile_library(out: Path, source: Path, flags: Sequence[str], includes: Sequence[str]):
    """Compiles `source` into the shared library `out` (a temporary file renamed into place),
    then records its digest in the sidecar. RuntimeError on a failure or a timeout."""
    out.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with files.atomic_output(out, suffix=".so.tmp") as tmp:
        cmd = [*compiler(), *flags, *includes, str(source), "-o", tmp]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=_timeout())
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"{shlex.join(cmd[:2])} ... timed out after {_timeout()} s"
            ) from None
        if done.returncode:
            raise RuntimeError(f"{shlex.join(cmd)} failed: {done.stderr.strip()[-2000:]}")
        if os.path.getsize(tmp) == 0:
            raise RuntimeError(f"{shlex.join(cmd)} wrote an empty library")
        os.chmod(tmp, 0o700)
        digest = files.sha256_file(tmp)
    _write_sidecar(out, digest)


def sidecar(library: Path) -> Path:
    return library.with_suffix(".json")


def _write_sidecar(library: Path, digest: str) -> None:
    record = json.dumps({"sha256": digest, "library": library.name})
    files.atomic_write(str(sidecar(library)), record.encode(), private=True)


def _private_file(path: Path) -> bool:
    """A regular file (not a link), owned by this user, writable by no one else."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def trusted(library: Path) -> bool:
    """True if `library` may be loaded: private (`_private_file`), non-empty, and its private
    sidecar names this library (an entry swapped with another's is not it) and the sha256
    recorded at build time."""
    side = sidecar(library)
    if not (_private_file(library) and _private_file(side)) or os.path.getsize(library) == 0:
        return False
    try:
        recorded = json.loads(read_regular_file(side, 4096).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return (
        isinstance(recorded, dict)
        and recorded.get("library") == library.name
        and recorded.get("sha256") == files.sha256_file(library)
    )


def _remove(*doomed: Path) -> None:
    for f in doomed:
        try:
            os.unlink(f)
        except FileNotFoundError:
            pass


def built(library: Path, build: Callable[[Path], None]) -> Path:
    """`library`, loaded from the cache if `trusted`, else (re)built by `build(library)`; old
    entries are pruned after a build. RuntimeError if the build fails or is not trusted."""
    if trusted(library):
        os.utime(library)  # marks it used (pruning goes by this time)
        return library
    _remove(library, sidecar(library))  # planted, corrupt, empty or half-written: rebuild
    build(library)
    if not trusted(library):
        raise RuntimeError(f"the kernel built at {library} does not match its recorded digest")
    prune(library.parent, keep=library)
    return library


def prune(directory: Path, keep: Path | None = None) -> list[Path]:
    """Removes libraries (with their sidecars) unused for PRUNE_AFTER_S, stale temporary files
    and sidecars without a library; returns what it removed. Only this user's files."""
    now = time.time()
    removed = []
    for entry in directory.iterdir():
        if entry == keep or not _private_file(entry):
            continue
        age = now - os.lstat(entry).st_mtime
        if entry.name.endswith(".tmp"):
            stale = age > _STALE_TMP_S
        elif entry.suffix == ".so":
            stale = age > PRUNE_AFTER_S
        elif entry.suffix == ".json":
            stale = not entry.with_suffix(".so").exists()
        else:
            continue
        if stale:
            _remove(entry, *([sidecar(entry)] if entry.suffix == ".so" else []))
            removed.append(entry)
    return removed
