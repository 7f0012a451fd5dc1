"""How orbax's failures are told: damage or not, in one line, without its log noise.

`is_damage` sorts a failed read into proof that a step's files are incomplete or corrupt
(the step is skipped and moved aside) and everything else (the run stops, nothing moved).
The log filters and the unraisable hook drop orbax's and tensorstore's repeats of an error
the caller already raises as one line.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import sys
import traceback
import warnings


class Damaged(Exception):
    """A step that is provably incomplete or corrupt (skipped by `restore_latest_good`)."""


class _UnrankedSaveFilter(logging.Filter):
    """Drops orbax's warning for a save without metrics when keep_best is on: periodic
    checkpoints between held-out evaluations are unranked by design (kept as "last N", never
    as "best"), so the warning would repeat at every such save and bury the progress output."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Requested `tracked_metric`; did not provide metrics" not in record.getMessage()


UNRANKED_FILTER = _UnrankedSaveFilter()


class _ReadOnlyNoticeFilter(logging.Filter):
    """Drops orbax's warnings that a read-only manager is read-only (asked for on purpose; they
    would turn a reader's one-line error into three lines)."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not msg.startswith(
            ("Given directory is read only", "CheckpointManagerOptions.read_only")
        )


READ_ONLY_FILTER = _ReadOnlyNoticeFilter()


class _BackgroundFailureFilter(logging.Filter):
    """Drops the tracebacks orbax logs for a failed save or read (one per failed thread,
    commit callback and asyncio task, through absl and asyncio's loggers): `Checkpointer`
    re-raises the same error as one `CheckpointError` line naming the step and the path, so
    these would only repeat it, hundreds of lines long. Records without a traceback, and
    every record not about orbax, pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or not record.exc_info:
            return True
        if "/orbax/" in record.pathname or "orbax" in record.getMessage():
            return False
        # asyncio's "Future exception was never retrieved", logged when a failed write's
        # future is collected (often at exit): its own path and message name no orbax, its
        # traceback does
        return not _raised_in_orbax(record.exc_info[1])


def _raised_in_orbax(e: BaseException | None) -> bool:
    """Whether a frame of `e`'s traceback, or of an exception it was raised from or during,
    is orbax's."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if any("/orbax/" in f.filename for f in traceback.extract_tb(e.__traceback__)):
            return True
        e = e.__cause__ or e.__context__
    return False


FAILURE_FILTER = _BackgroundFailureFilter()


def quiet_closed_loop_callbacks() -> None:
    """After a failed tensorstore read or write, its C++ threads still call back into the
    asyncio loop orbax already closed; each such call prints an 'Event loop is closed'
    traceback through `sys.unraisablehook`. They are harmless (the operation is over and
    its error was raised), so only those are dropped; every other unraisable is passed on."""
    if getattr(sys.unraisablehook, "_gpn_jax", False):
        return
    previous = sys.unraisablehook

    def hook(unraisable):
        e = unraisable.exc_value
        if isinstance(e, RuntimeError) and str(e) == "Event loop is closed":
            return
        previous(unraisable)

    hook._gpn_jax = True
    sys.unraisablehook = hook


def silence_abandoned_writes() -> None:
    """After a failed save, no warning for the write coroutines orbax created but never ran.

    When one array's write fails, orbax drops the other arrays' pending
    `async_serialize_from_host.<locals>.write_fragment` coroutines; Python warns "coroutine
    ... was never awaited" when they are collected, often at interpreter exit, after the
    run's one-line error (`test_failed_checkpoint_write_is_one_line`).
    They hold nothing to save: the step's unfinished files are removed and the error says so.
    Only that coroutine's warning is ignored."""
    warnings.filterwarnings(
        "ignore",
        message=r"coroutine '[\w.<>]*write_fragment' was never awaited",
        category=RuntimeWarning,
    )


# tensorstore status codes of a read that found damaged or missing data. Others
# (PERMISSION_DENIED, UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, UNKNOWN, ...) are
# not evidence about the checkpoint and stop the run instead.
_DAMAGE_CODES = ("DATA_LOSS:", "NOT_FOUND:", "OUT_OF_RANGE:")


def is_damage(e: BaseException) -> bool:
    """True for errors that prove the step's files are incomplete or corrupt.

    tensorstore raises ValueError('<CODE>: ...'): a truncated array file is OUT_OF_RANGE, a
    deleted one NOT_FOUND, a garbled manifest DATA_LOSS. orbax raises KeyError for a missing
    item; a garbled text file (JSON item, `_sharding`, `array_metadatas/process_0`) fails to
    decode (UnicodeDecodeError) or parse (JSONDecodeError); a checksum mismatch or a
    wrong-typed item is `Damaged` itself. A PermissionError or other OSError is not damage.
    """
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, Damaged | json.JSONDecodeError | UnicodeDecodeError | FileNotFoundError):
            return True
        if isinstance(e, KeyError) and "was not found in the checkpoint" in str(e):
            return True
        if isinstance(e, ValueError) and str(e).startswith(_DAMAGE_CODES):
            return True
        if isinstance(e, ValueError) and _undecodable(str(e)):
            return True
        e = e.__cause__ or e.__context__
    return False


def _undecodable(msg: str) -> bool:
    """A chunk that failed to decompress (tensorstore says FAILED_PRECONDITION with the
    codec's error, e.g. a flipped byte in a zstd frame header)."""
    return msg.startswith("FAILED_PRECONDITION:") and any(
        word in msg for word in ("ZSTD", "zstd", "decod", "Decod", "checksum")
    )


def write_reason(e: BaseException) -> str:
    """The OS reason of a failed write ('File too large (EFBIG)'), else the error in one line.

    tensorstore reports OS errors inside a ValueError as `[os_error_code='27']`."""
    code = getattr(e, "errno", None)
    found = re.search(r"os_error_code='?(\d+)", str(e))
    code = int(found.group(1)) if code is None and found else code
    if code in errno.errorcode:
        return f"{os.strerror(code)} ({errno.errorcode[code]})"
    return one_line(e)


def one_line(e: BaseException, limit: int = 300) -> str:
    """`Type: message` squashed to one line, truncated."""
    msg = " ".join(str(e).split())
    text = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
