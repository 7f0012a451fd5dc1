"""Loads a trained run back from its workdir: config, model, parameters and tokenizer.

Evaluation, analysis, generation, export and lm-eval's harness all start here (`load_run`),
so they see exactly what training saved, verified as resume verifies it: every step is
checked (complete, regular files only, its step number, every array read against its
checksum) before use, a damaged one is skipped for the newest good one, and one line on
stderr says which step was used and why it skipped any (the log alone, if none was). They
only read the workdir (local or `gs://`): nothing is created, probed, cleaned, moved or
deleted there, and no lock is taken.
"""

import atexit
import dataclasses
import functools
import hashlib
import logging
import shutil
import sys
import tempfile

import jax
import ml_collections

from gpn_jax.checkpoints.manager import Checkpointer
from gpn_jax.configs import blocks
from gpn_jax.data.tokenizer import Tokenizer, load_tokenizer
from gpn_jax.io import paths
from gpn_jax.io.errors import CheckpointError
from gpn_jax.models import factory
from gpn_jax.models.bounds import check_model_size

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RestoredRun:
    config: ml_collections.ConfigDict
    model: object
    params: dict
    tokenizer: Tokenizer | None
    step: int
    workdir: str

    def data(self, cache_dir: str | None = None):
        """The run's data rebuilt as training built it (`data.from_config`: same split,
        tokenizer and windows), reading the workdir only: the tokenizer is the workdir's file
        (never trained or saved there) and token caches go to `cache_dir` (default: a
        temporary directory removed at exit), never to `<workdir>/data_cache`."""
        from gpn_jax.data import pipeline  # the pipeline (Grain) only for a reader of the data

        config = ml_collections.ConfigDict(self.config.to_dict())
        if self.tokenizer is not None and not config.data.tokenizer_path:
            config.data.tokenizer_path = self.tokenizer.path
        return pipeline.from_config(
            config,
            cache_dir=cache_dir or _temporary_cache(),
            process_index=jax.process_index(),
            process_count=jax.process_count(),
        )


def require_checkpoints(workdir: str) -> str:
    """`workdir` made absolute; CheckpointError at once if it has no checkpoint directory."""
    workdir = paths.absolute(workdir)
    if not paths.exists(paths.join(workdir, "checkpoints")):
        raise CheckpointError(f"no checkpoint in {workdir} (train one with gpn_jax.train first)")
    return workdir


def load_run(workdir: str, step: int | None = None) -> RestoredRun:
    """The newest readable (or the given) checkpoint of `workdir`, parameters on the default device.

    Only the parameters are read (orbax partial restore of the state's `params` subtree): no
    optimiser is built and its state is never loaded. The tokenizer is checked against the
    sha256 the checkpoint records (`check_tokenizer`).

    Raises:
      CheckpointError: no checkpoint in the workdir, no undamaged one (or the given `step`
        is damaged), or the workdir's tokenizer is not the one the run was trained with.
    """
    workdir = require_checkpoints(workdir)
    ckpt = Checkpointer(workdir, keep=None, async_save=False, read_only=True)
    try:
        config = blocks.complete(_config_from_latest(ckpt, step))  # an older run's too
        try:  # the trainer's bounds, before anything is built: the config may be edited
            check_model_size(config.model)
        except ValueError as e:
            raise CheckpointError(f"{workdir}: its config is out of bounds: {e}") from None
        model = factory.build_model(config.model)
        # Restore onto this process's default device, whatever topology wrote the checkpoint.
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        target = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
            jax.eval_shape(model.init, jax.random.PRNGKey(0)),
        )
        if step is None:
            got, params, _, _, meta = ckpt.restore_latest_good(target, params_only=True, warn=False)
        else:
            got, params, _, _, meta = ckpt.restore(target, step, params_only=True)
        _say_step(ckpt, got)
    finally:
        ckpt.close()
    tok_path = config.data.tokenizer_path or paths.join(workdir, "tokenizer.model")
    tokenizer = load_tokenizer(tok_path) if paths.exists(tok_path) else None
    check_tokenizer(meta, tokenizer, tok_path, got)
    return RestoredRun(config, model, params, tokenizer, got, workdir)


def _say_step(ckpt: Checkpointer, step: int) -> None:
    """The step used, in the log; if a damaged one was skipped, also one line on stderr
    saying which and why (a clean load prints nothing, so its one-line errors stay one)."""
    line = f"using checkpoint step {step} of {ckpt.directory}"
    if not ckpt.skipped:
        log.info(line)
        return
    why = "; ".join(f"step {s}: {reason}" for s, reason in ckpt.skipped)
    print(f"{line} (skipped damaged {why})", file=sys.stderr)


def tokenizer_sha256(tokenizer: Tokenizer | None) -> str | None:
    """What a checkpoint's `meta` records as `tokenizer_sha256` (None: a run without one)."""
    return hashlib.sha256(tokenizer.model_proto).hexdigest() if tokenizer is not None else None


_WARNED_NO_DIGEST: set = set()


def check_tokenizer(meta: dict, tokenizer: Tokenizer | None, path: str, step: int) -> None:
    """CheckpointError (one line naming the file and the fix) unless the tokenizer at `path`
    is the one checkpoint step `step` records in its meta; a checkpoint saved before
    tokenizer digests is warned about once and used."""
    want = meta.get("tokenizer_sha256", "absent")
    if want == "absent":
        if tokenizer is not None and path not in _WARNED_NO_DIGEST:
            _WARNED_NO_DIGEST.add(path)
            log.warning(
                "checkpoint step %d records no tokenizer digest: %s not verified", step, path
            )
        return
    got = tokenizer_sha256(tokenizer)
    if got == want:
        return
    if tokenizer is None:
        raise CheckpointError(
            f"{path} is missing, but checkpoint step {step} was trained with a tokenizer "
            f"(sha256 {str(want)[:12]}...); put the run's tokenizer.model back there"
        )
    raise CheckpointError(
        f"{path} has sha256 {got[:12]}..., but checkpoint step {step} was trained with "
        f"sha256 {str(want)[:12]}...: not the run's tokenizer; put the run's tokenizer.model "
        "back there"
    )


@functools.cache
def _temporary_cache() -> str:
    path = tempfile.mkdtemp(prefix="gpn_jax_cache-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _config_from_latest(ckpt: Checkpointer, step: int | None) -> ml_collections.ConfigDict:
    """The JSON `config` item of the newest step whose config reads as a JSON object (or of
    `step`); no arrays are read (JSON is data only). A damaged one falls back, as restore does."""
    steps = ckpt.all_steps()
    if not steps:
        raise CheckpointError(f"no checkpoint in {ckpt.directory}")
    if step is not None and step not in steps:
        raise CheckpointError(
            f"--step={step}: {ckpt.directory} has no step {step}; its steps are "
            f"{', '.join(map(str, steps))}"
        )
    steps = steps if step is None else [step]
    for s in sorted(steps, reverse=True):
        try:
            return ml_collections.ConfigDict(ckpt.read_config(s))
        except Exception:  # noqa: BLE001 - fall back to an older step, as restore does
            continue
    raise CheckpointError(
        f"no readable config in {ckpt.directory}: each step's config/metadata is unreadable "
        "or not a JSON object; retrain, or restore the files from a copy"
    )
