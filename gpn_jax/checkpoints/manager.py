"""Checkpointing: a thin wrapper around `orbax.checkpoint.CheckpointManager`.

Each step directory `<workdir>/checkpoints/<step>/` holds four orbax items:

* ``state``  - pytree of arrays (params, opt state, step, rng), StandardSave.
* ``data``   - the data-iterator position, through Grain's orbax handler
               (`grain.checkpoint.CheckpointHandler`): one `process_<i>-of-<n>.json` per host.
* ``config`` - JSON run config.
* ``meta``   - JSON extras (tokens_seen, metrics, ...).

Atomicity comes from orbax: on local/posix filesystems a step is written to
``<step>.orbax-checkpoint-tmp`` and renamed to ``<step>`` only once every item
is committed; step discovery skips names containing ``.orbax-checkpoint-tmp``
(``commit_success.txt`` is also written but only checked on GCS, where it
replaces the rename). A killed save therefore never shows up as a step. Damage *after* finalisation (truncated or
deleted files) is only found when reading, which `restore_latest_good` handles.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import grain
import jax
import orbax.checkpoint as ocp
from etils import epath

from gpn_jax.checkpoints import checksums, failures, step_files
from gpn_jax.checkpoints import items as items_lib
from gpn_jax.io import lock as workdir_lock
from gpn_jax.io import paths
from gpn_jax.io.errors import CheckpointError
from gpn_jax.io.files import atomic_write

log = logging.getLogger(__name__)


_JSON_ITEMS = ("config", "meta", "checksums")
_RELISTS = 5  # step lists re-read when a step vanishes while read (a live run's rotation)


def _prepare_directory(workdir: str | os.PathLike) -> str:
    """Creates `<workdir>/checkpoints` (local or `gs://`) and proves it is writable.

    Args:
        workdir: Run directory.

    Returns:
        Absolute path (or URL) of the checkpoint directory.

    Raises:
        CheckpointError: If the directory cannot be created or written.
    """
    directory = paths.join(paths.absolute(workdir), "checkpoints")
    try:
        paths.make_dirs(directory)
        paths.probe_writable(directory)  # a per-host name: hosts starting at once never race
    except OSError as e:
        raise CheckpointError(
            f"checkpoint directory {directory} is not usable: {type(e).__name__}: {e.strerror or e}"
        ) from None
    return directory


def _remove_unfinished(directory: str, level: int = logging.WARNING) -> None:
    """Deletes tmp dirs left by killed or failed saves (orbax never lists them as steps)."""
    if jax.process_index() != 0:
        return
    for tmp in ocp.path.step.all_temporary_paths(directory):
        log.log(level, "removing unfinished checkpoint %s (interrupted save)", tmp.get())
        tmp.get().rmtree()


class Checkpointer:
    """Saves/restores training checkpoints with keep-N/keep-best retention.

    The workdir may be local or a `gs://` URL (orbax writes the object store
    natively and commits with `commit_success.txt` there instead of a rename).

    Args:
        workdir: Run directory; checkpoints go to `<workdir>/checkpoints`.
        keep: Number of most recent steps to keep (None keeps all).
        keep_best: Additionally keep this many best steps by `best_metric`.
        best_metric: Key in the `metrics` dict passed to `save`.
        best_mode: 'min' or 'max'.
        async_save: If True, `save` returns once arrays are copied to host.
        cleanup_tmp: Delete leftover tmp dirs of killed saves at construction.
            Set False in processes that only read a directory another process
            may be saving into (e.g. an evaluator), or they would break its save.
        read_only: Only read: no lock, directory creation, write probe or tmp-dir
            cleanup, and orbax's own read-only mode (no save, delete or
            metadata write). What evaluators and analyses use.

    A writer (not `read_only`) holds the workdir's lock (`io.lock`) from here to
    `close`, before it removes anything: a second writer is refused in one line naming the
    holder, and never deletes the first one's unfinished save.

    Raises:
        CheckpointError: If the directory is not usable, or another trainer holds its lock.
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        keep: int | None = 3,
        keep_best: int | None = None,
        best_metric: str = "heldout_loss",
        best_mode: str = "min",
        async_save: bool = True,
        cleanup_tmp: bool = True,
        read_only: bool = False,
    ):
        if best_mode not in ("min", "max"):
            raise ValueError(f"best_mode must be 'min' or 'max', got {best_mode!r}")
        if read_only:
            logging.getLogger("absl").addFilter(
                failures.READ_ONLY_FILTER
            )  # orbax logs through absl
            self.directory = paths.join(paths.absolute(workdir), "checkpoints")
            if not paths.exists(self.directory):
                raise CheckpointError(f"no checkpoint in {paths.absolute(workdir)}")
        else:
            self.directory = _prepare_directory(workdir)
        self._lock = None
        if not read_only and jax.process_index() == 0:  # one lock per run, not per host
            self._lock = workdir_lock.acquire(paths.absolute(workdir))
        try:
            self._open(keep, keep_best, best_metric, best_mode, async_save, cleanup_tmp, read_only)
        except BaseException:
            self.release_lock()
            raise

    def _open(self, keep, keep_best, best_metric, best_mode, async_save, cleanup_tmp, read_only):
        """The rest of `__init__`, once the lock (a writer's) is held."""
        self.skipped: list[tuple[int, str]] = []  # (step, why) of the last restore_latest_good
        if cleanup_tmp and not read_only:
            # Here, synchronously, not by orbax's background thread: it cannot race restore/close.
            _remove_unfinished(self.directory)
        self.best_metric = best_metric
        self._in_flight: int | None = None  # step of the async save not yet known written
        self._write_failed = False
        for name in ("absl", "asyncio"):  # orbax logs through absl; its tasks through asyncio
            logging.getLogger(name).addFilter(failures.FAILURE_FILTER)
        failures.quiet_closed_loop_callbacks()
        self._track_best = keep_best is not None
        if self._track_best:
            logging.getLogger("absl").addFilter(failures.UNRANKED_FILTER)  # orbax logs through absl
        options = ocp.CheckpointManagerOptions(
            # orbax only writes/reads per-step metrics when best_fn is set.
            best_fn=(lambda m: float(m[best_metric])) if self._track_best else None,
            best_mode=best_mode,
            preservation_policy=items_lib.preservation_policy(
                keep, keep_best, best_metric, best_mode
            ),
            enable_async_checkpointing=async_save and not read_only,
            create=not read_only,
            read_only=read_only,
        )
        handlers = {
            "state": ocp.StandardCheckpointHandler(),
            "data": grain.checkpoint.CheckpointHandler(),
        }
        handlers.update({k: ocp.JsonCheckpointHandler() for k in _JSON_ITEMS})
        step_files.check_step_metadata(self.directory)
        self._mngr = ocp.CheckpointManager(self.directory, item_handlers=handlers, options=options)

    def save(
        self,
        step: int,
        state: Any,
        data_state: Mapping[str, Any],
        config_dict: Mapping[str, Any],
        meta: Mapping[str, Any],
        metrics: Mapping[str, Any] | None = None,
        force: bool = False,
    ) -> bool:
        """Starts saving `step` (async unless disabled); returns True if started.

        Args:
            step: Training step; becomes the directory name.
            state: Pytree of arrays.
            data_state: JSON-able data iterator position.
            config_dict: JSON-able run config.
            meta: JSON-able extras.
            metrics: Optional scalars; `best_metric` ranks steps for keep_best.
            force: Save even if orbax's save-interval policy says no.

        Returns:
            False if orbax skipped the step (e.g. a step >= `step` exists).
        """
        items = {
            "config": items_lib.json_safe(config_dict),
            "meta": items_lib.json_safe(meta),
            "data": items_lib.json_safe(data_state),
        }
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=grain.checkpoint.CheckpointSave(items_lib.DataState(items["data"])),
            config=ocp.args.JsonSave(items["config"]),
            meta=ocp.args.JsonSave(items["meta"]),
            checksums=ocp.args.JsonSave(checksums.make(state, items, step)),
        )
        metrics = items_lib.json_safe(metrics)
        # Steps lacking the metric are not ranked (orbax treats None as "none").
        ranked = metrics if self._track_best and self.best_metric in metrics else None
        self.wait_until_finished()  # a failure of the previous async save names its own step
        try:
            started = bool(self._mngr.save(step, args=args, metrics=ranked, force=force))
        except Exception as e:  # noqa: BLE001 - any failed write becomes one line
            raise self._write_error(step, e) from None
        self._in_flight = step if started else None
        latest = self.latest_step()
        if not started and latest is not None and latest >= step:
            # orbax never saves at or behind its newest step; say so loudly.
            log.warning("step %d not saved: checkpoint step %d already exists", step, latest)
        return started

    def restore(
        self, target: Any, step: int | None = None, params_only: bool = False
    ) -> tuple[int, Any, dict, dict, dict]:
        """Restores one step onto `target`'s structure, dtypes and shardings, verified
        against the step's checksums.

        Args:
            target: Example pytree of arrays, or abstract pytree of
                `jax.ShapeDtypeStruct` (with `.sharding` to place on a mesh).
            step: Step to restore; latest if None.
            params_only: `target` is the parameters alone: only the `params` subtree of the
                saved state is read (no optimiser state needed, none read).

        Returns:
            (step, state, data_state, config_dict, meta).

        Raises:
            CheckpointError: If there is no checkpoint to restore, or the step is damaged
                (a checksum mismatch, a wrong-typed item).
        """
        self.wait_until_finished()
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        if step not in self.all_steps():
            raise CheckpointError(f"no checkpoint step {step} in {self.directory}")
        try:
            return self._restore_checked(target, step, None, params_only)
        except failures.Damaged as e:
            raise CheckpointError(
                f"checkpoint step {step} in {self.directory} is damaged: {e}"
            ) from None

    def _restore_verified(self, target: Any, step: int, params_only: bool) -> tuple:
        """`restore` of one step; Damaged for a checksum mismatch or a wrong-typed item."""
        record = self._read_checksums(step)
        abstract = jax.tree.map(items_lib.abstract_leaf, target)
        names = ("config", "meta")
        json_args = {k: ocp.args.JsonRestore() for k in names} | self._data_args(step)
        # Safe on untrusted files: StandardRestore reads tensorstore arrays into `abstract`'s
        # structure (JSON metadata), JsonRestore and Grain's handler read JSON; orbax
        # unpickles nothing here.
        if params_only:
            out = self._mngr.restore(step, args=ocp.args.Composite(**json_args))
            state = {"params": self._restore_params(step, abstract)}
        else:
            args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract), **json_args)
            out = self._mngr.restore(step, args=args)
            state = out["state"]
        where = f"step {step}"
        items = {k: step_files.json_item(out[k], f"{where} {k}") for k in names}
        items["data"] = step_files.json_item(self._data_state(step, out), f"{where} data state")
        if record is None:
            log.info("checkpoint step %d has no checksums (an older save): not verified", step)
        else:
            checksums.verify(record, state, items, where)
        checksums.verify_step(step, record, items["meta"], where)
        state = state["params"] if params_only else state
        return step, state, items["data"], items["config"], items["meta"]

    def _read_checksums(self, step: int) -> dict | None:
        """The step's checksum record (None for a step saved before checksums). A step whose
        orbax metadata lists a `checksums` item it no longer has is damaged: deleting the
        record must not switch its verification off."""
        step_dir = self._step_path(step)
        if not (step_dir / "checksums").exists():
            if "checksums" in step_files.saved_items(step_dir):
                raise failures.Damaged(
                    "its checksums item is missing (the step was saved with one)"
                )
            return None
        return checksums.validate(
            step_files.read_json(step_dir / "checksums" / step_files.JSON_FILE),
            f"step {step} checksums",
        )

    def _data_args(self, step: int) -> dict:
        """Restore args of the `data` item if Grain's handler wrote this host's file."""
        if (self._step_path(step) / "data" / step_files.grain_file(jax.process_index())).exists():
            return {"data": grain.checkpoint.CheckpointRestore(items_lib.DataState())}
        return {}

    def _data_state(self, step: int, out) -> dict:
        """The restored data position; else another host's (the run had another host count:
        every host's position is the same global step)."""
        if "data" in out:
            return out["data"].get_state()
        folder = self._step_path(step) / "data"
        files = sorted(folder.glob("process_0-of-*.json")) or [folder / step_files.grain_file(0)]
        return step_files.read_json(files[0])

    def _restore_params(self, step: int, abstract_params: Any) -> Any:
        """The `params` subtree of `step`'s state item, read alone.

        orbax's partial restore (`PyTreeRestore(partial_restore=True)`) reads only the leaves
        the target names. It needs the PyTree handler, while the manager's `state` item is
        registered with the Standard one (same on-disk format), so the item is read here
        directly. Safe on untrusted files as `restore`: tensorstore arrays, no pickles.
        """
        item = {"params": abstract_params}
        args = ocp.args.PyTreeRestore(
            item,
            restore_args=ocp.checkpoint_utils.construct_restore_args(item),
            partial_restore=True,
        )
        with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as reader:
            return reader.restore(self._step_path(step) / "state", args=args)["params"]

    def restore_latest_good(
        self,
        target: Any,
        quarantine: bool = False,
        check_config: Callable[[dict], None] | None = None,
        params_only: bool = False,
        warn: bool = True,
    ) -> tuple[int, Any, dict, dict, dict]:
        """Restores the newest step that reads cleanly, warning on each damaged one.

        Only damage is skipped: a step missing a part orbax writes (commit marker, metadata,
        an item) or whose read fails with a data error (truncated, missing or garbled array
        file, unparsable JSON; see `failures.is_damage`). Any other error (permissions, a transient
        I/O error, a bug) stops here with a one-line CheckpointError and nothing is moved.

        Args:
            target: As for `restore`.
            quarantine: Rename damaged steps newer than the restored one to
                `<step>.unreadable-<n>` (kept for inspection, invisible to orbax; each
                rename is logged). A resuming trainer wants this, or orbax refuses to save
                those steps again; readers should leave it False.
            check_config: Called with a step's JSON config before its arrays are read (e.g.
                to reject a checkpoint of another model); its exceptions propagate.
            params_only: As for `restore`.
            warn: Log a warning per damaged step (else the caller reports `self.skipped`,
                the (step, reason) of each, in its own words).

        Returns:
            As for `restore`.

        Raises:
            CheckpointError: If no step could be restored, or a read failed for a reason
                other than damage.
        """
        self.wait_until_finished()
        for _ in range(1 + _RELISTS):  # a live run deletes old steps: list them again
            reasons, bad, self.skipped = [], [], []
            for step in sorted(self.all_steps(), reverse=True):
                try:
                    restored = self._restore_checked(target, step, check_config, params_only)
                except failures.Damaged as e:
                    if self._vanished(step):
                        break
                    if warn:
                        log.warning("checkpoint step %d unreadable, falling back: %s", step, e)
                    reasons.append(f"step {step}: {e}")
                    self.skipped.append((step, str(e)))
                    bad.append(step)
                    continue
                if quarantine and bad:
                    self._quarantine(bad)
                return restored
            else:
                break
        detail = "; ".join(reasons) or "no finalized steps"
        raise CheckpointError(f"no readable checkpoint in {self.directory}: {detail}")

    def _vanished(self, step: int) -> bool:
        """True if `step` is gone from the re-read step list (a live trainer deleted it while
        it was read): the caller lists the steps again instead of calling it damaged."""
        self.reload()
        return step not in self.all_steps()

    def _restore_checked(self, target: Any, step: int, check_config, params_only=False) -> tuple:
        """`restore(target, step)` after the completeness and config checks; raises
        failures.Damaged for damage, CheckpointError for any other read failure."""
        try:
            self._check_files(step)
            config = self.read_config(step)
        except Exception as e:  # noqa: BLE001 - sorted into damage / not below
            raise self._read_failure(step, e) from None
        if check_config is not None:
            check_config(config)
        try:
            return self._restore_verified(target, step, params_only)
        except Exception as e:  # noqa: BLE001
            raise self._read_failure(step, e) from None

    def _read_failure(self, step: int, e: BaseException) -> Exception:
        if isinstance(e, failures.Damaged):
            return e
        if failures.is_damage(e):
            return failures.Damaged(failures.one_line(e))
        return CheckpointError(
            f"cannot read checkpoint step {step} in {self.directory}: {failures.one_line(e)}; "
            "not a sign of damage, so the run stops and every step directory stays where it is"
        )

    def _step_path(self, step: int) -> epath.Path:
        return epath.Path(self.directory) / str(step)

    def read_config(self, step: int) -> dict:
        """The JSON `config` item of `step`, read without touching any array.

        Raises:
            failures.Damaged: unparsable, or not a JSON object.
        """
        path = self._step_path(step) / "config" / step_files.JSON_FILE
        return step_files.json_item(step_files.read_json(path), f"step {step} config")

    def _quarantine(self, steps: list[int]) -> None:
        """Moves step dirs aside under names orbax does not parse as steps."""
        if jax.process_index() == 0:
            for step in steps:
                src = paths.join(self.directory, str(step))
                n = 0
                while paths.exists(dst := f"{src}.unreadable-{n}"):
                    n += 1
                epath.Path(src).rename(dst)  # on gs:// a copy + delete: kept for inspection only
                log.warning("moved unreadable checkpoint %s to %s", src, dst)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("gpn_jax_checkpoint_quarantine")
        self._mngr.reload()

    def latest_step(self) -> int | None:
        """Newest finalized step (tmp dirs of unfinished saves are ignored)."""
        return self._mngr.latest_step()

    def all_steps(self) -> list[int]:
        """All finalized steps, ascending."""
        return sorted(self._mngr.all_steps())

    def reload(self) -> None:
        """Re-reads the step list from disk (after external changes)."""
        self.wait_until_finished()
        self._mngr.reload()

    def wait_until_finished(self) -> None:
        """Blocks until pending async saves (and old-step deletion) finish.

        Raises:
            CheckpointError: One line naming the step and path, if the pending save failed
                (raised once; the manager is unusable afterwards).
        """
        if self._write_failed:
            return
        try:
            self._mngr.wait_until_finished()
        except Exception as e:  # noqa: BLE001 - any failed write becomes one line
            raise self._write_error(self._in_flight, e) from None
        if self._in_flight is not None:
            self._seal(self._in_flight)
        self._in_flight = None

    def _seal(self, step: int) -> None:
        """Records the sha256 of a finished step's metadata files (`checksums.file_record`),
        written under a temporary name and renamed. A step without this record (the process
        was killed before it) still has its leaf checksums."""
        step_dir = self._step_path(step)
        if jax.process_index() != 0 or not step_dir.exists():
            return
        target = step_dir / "checksums" / checksums.FILES
        record = json.dumps(checksums.file_record(step_dir), sort_keys=True)
        atomic_write(str(target), record.encode())

    def newest_intact_step(self) -> int | None:
        """The newest step that is complete and whose metadata files match their recorded
        checksums (what a run stopped by the NaN guard can resume from); None if none."""
        self.wait_until_finished()
        for step in sorted(self.all_steps(), reverse=True):
            try:
                self._check_files(step)
            except Exception:  # noqa: BLE001 - any failure: not this step
                continue
            return step
        return None

    def _check_files(self, step: int) -> None:
        """failures.Damaged if `step` lacks a part or a metadata file differs from its record."""
        step_files.check_tree(self._step_path(step))  # before anything opens its files
        missing = [p for p in step_files.REQUIRED_PARTS if not (self._step_path(step) / p).exists()]
        if missing:
            raise failures.Damaged(f"incomplete (missing {', '.join(missing)})")
        checksums.verify_files(self._step_path(step), f"step {step}")

    def release_lock(self) -> None:
        """Gives back the workdir lock (a writer's; idempotent). `close` does it too."""
        if getattr(self, "_lock", None) is not None:
            self._lock.release()
            self._lock = None

    def close(self) -> None:
        """Waits for pending saves, releases orbax resources and the workdir lock."""
        try:
            self._close()
        finally:
            self.release_lock()

    def _close(self) -> None:
        if self._write_failed:
            try:  # orbax re-raises the failed save's error on every wait; reported already
                self._mngr.close()
            except Exception:  # noqa: BLE001
                log.info("closing after a failed save", exc_info=True)
            return
        try:
            self.wait_until_finished()
            self._mngr.close()
        except CheckpointError:
            raise
        except Exception as e:  # noqa: BLE001
            raise self._write_error(self._in_flight, e) from None

    def _write_error(self, step: int | None, e: BaseException) -> CheckpointError:
        """One-line CheckpointError for a failed save; removes its unfinished files.

        orbax writes a step under `<step>.orbax-checkpoint-tmp` and renames it only when every
        item is committed, so a failed save is never listed as a step; its files are deleted
        here to give back the space (and said so in the message, not in a second log line).
        """
        self._write_failed = True
        failures.silence_abandoned_writes()
        where = paths.join(self.directory, str(step) if step is not None else "")
        try:
            _remove_unfinished(self.directory, level=logging.INFO)
            removed = "its unfinished files were removed"
        except OSError as rm:
            removed = f"its unfinished files could not be removed ({rm.strerror or rm})"
        latest = self._mngr.latest_step()
        kept = (
            f"newest complete checkpoint: step {latest}"
            if latest is not None
            else "no complete checkpoint"
        )
        return CheckpointError(
            f"cannot write checkpoint step {step} to {where}: {failures.write_reason(e)}; {removed}; {kept}"
        )

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
