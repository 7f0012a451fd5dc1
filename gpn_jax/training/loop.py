"""`train_and_evaluate(config, workdir)`: the main job, shared by the absl launcher and Colab.

Rerunning it on a workdir that holds a checkpoint resumes from the newest readable one
(bit-identical to an uninterrupted run: parameters, optimiser state, RNG and the data
iterator position are all restored). SIGTERM saves and returns. A step that is not finite
is not applied (the jitted step keeps the previous state) and stops the run, so nothing
non-finite is ever saved. The config is validated (`validate`) before any work.
"""

import contextlib
import itertools
import json
import math
import os
import signal
import sys
import threading

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from gpn_jax.checkpoints.manager import Checkpointer
from gpn_jax.checkpoints.restore import tokenizer_sha256
from gpn_jax.configs import blocks
from gpn_jax.data import pipeline
from gpn_jax.io import cli, paths
from gpn_jax.io.errors import TrainingError
from gpn_jax.kernels import selfcheck
from gpn_jax.models import accounting, factory
from gpn_jax.models import configs as model_configs
from gpn_jax.parallel import mesh as meshlib
from gpn_jax.training import init_from, progress, setup, validate
from gpn_jax.training import train_step as ts
from gpn_jax.training.host_memory import cpu_steps_inline, steady_step_memory
from gpn_jax.training.metric_writer import MetricWriter, parse_writers, run_info

FINAL_METRICS = "final_metrics.json"

# Model fields that change how the math is computed, never its result or the parameters:
# they may change when a run resumes (declared on the field: `models.configs.switch`).
MATH_FREE_MODEL_FIELDS = model_configs.math_free_fields()
_MISSING = "(absent)"


def model_difference(saved: dict, current: dict) -> str | None:
    """'d_model 64 (checkpoint) != 32 (config)' for the first model field that differs
    (math-free fields excepted), or None. An empty `saved` (no model block) is no evidence."""
    if not saved:
        return None
    fields = [*current, *(k for k in saved if k not in current)]
    differ = [
        k
        for k in fields
        if k not in MATH_FREE_MODEL_FIELDS and saved.get(k, _MISSING) != current.get(k, _MISSING)
    ]
    if not differ:
        return None
    k, more = differ[0], len(differ) - 1
    tail = f" (and {more} more field(s))" if more else ""
    return f"{k} {saved.get(k, _MISSING)} (checkpoint) != {current.get(k, _MISSING)} (config){tail}"


def prepare_workdir(workdir: str) -> str:
    """Absolute (or `gs://`), existing, writable workdir, or a one-line ValueError.

    Every host probes under its own name (`paths.probe_writable`), so hosts starting at once
    never remove each other's probe.
    """
    if not workdir:
        raise ValueError("--workdir is required")
    workdir = paths.absolute(workdir)
    try:
        paths.make_dirs(workdir)
        paths.probe_writable(workdir)
    except OSError as e:
        raise ValueError(f"workdir {workdir} is not writable: {e.strerror or e}") from None
    final = paths.join(workdir, FINAL_METRICS)  # written at the end: a blocker fails now
    if not paths.is_remote(final) and os.path.lexists(final) and not os.path.isfile(final):
        raise ValueError(f"{final} is not a regular file; move it away, the run writes it")
    return workdir


class StopSignal:
    """SIGTERM (preemption) -> every host stops after the same step; the loop asks `should_stop`.

    One host: a Python SIGTERM and SIGINT (Ctrl-C) handler sets a flag the loop checks between
    steps (main thread only); `name` says which came. A second signal is not caught: it
    terminates the process, so a run stuck inside a step can still be stopped (the last
    finished checkpoint stays the latest).

    Several hosts (`jax.distributed` up): JAX's preemption sync manager, not an all-reduced
    flag. Its notifier catches SIGTERM on whichever host gets it; the coordination service
    then picks the step after the furthest host's current one, and
    `multihost_utils.reached_preemption_sync_point(step)` turns True on every host at exactly
    that step. Per step it is a local check (no collective, no device sync), whereas an
    all-gathered flag would add a cross-host round trip and block on the step's results,
    undoing the one-step-late metric reads. So no Python handler is installed there: it would
    replace the notifier's. (A second SIGTERM is then swallowed; SIGKILL still works.) With
    `jax_enable_preemption_service=False` each host falls back to its own flag (no agreement).
    """

    def __init__(self):
        self.requested, self.name = False, "SIGTERM"
        self._previous = {}
        self._multihost = (
            jax.process_count() > 1
            and jax.distributed.is_initialized()
            and _preemption_service_enabled()
        )
        if not self._multihost and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum, frame):
        del frame
        self.requested, self.name = True, signal.Signals(signum).name
        signal.signal(signum, signal.SIG_DFL)

    def should_stop(self, step: int) -> bool:
        """Called once after every step, with the same step numbers on every host."""
        if self._multihost and multihost_utils.reached_preemption_sync_point(step):
            self.requested = True
        return self.requested

    def restore(self):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)


def _preemption_service_enabled() -> bool:
    """jax.distributed started its preemption sync manager (`jax_enable_preemption_service`)."""
    from jax._src import distributed as jax_distributed  # no public accessor for it

    return jax_distributed.global_state.preemption_sync_manager is not None


def evaluate_heldout(eval_step, params, data, mesh, max_batches: int = 0, stride: int = 1) -> dict:
    """Mean CE / PPL over the held-out windows (all positions, as the training loss): every
    `stride`-th batch of the in-order split (a sample spread over all of it, where a prefix is
    one corner of a document-ordered corpus), at most `max_batches` of them (0: no cap)."""
    total, count, tokens = 0.0, 0.0, []
    picked = itertools.islice(data.heldout_windows(), 0, None, stride)
    for i, batch in enumerate(picked):
        if max_batches and i >= max_batches:
            break
        ce, n = eval_step(params, meshlib.put_batch(batch, mesh))
        total, count = total + float(ce), count + float(n)
        tokens.append(_all_hosts(batch))
    loss = total / count
    return {"loss": loss, "ppl": math.exp(loss), "tokens": np.concatenate(tokens)}


def _all_hosts(rows: np.ndarray) -> np.ndarray:
    """This host's rows of a batch -> the whole global batch (identity on one host)."""
    if jax.process_count() == 1:
        return rows
    return np.asarray(multihost_utils.process_allgather(rows, tiled=True))


def unigram_ppl(counts: np.ndarray, tokens: np.ndarray) -> float:
    """PPL of the add-one-smoothed unigram model of the training tokens on `tokens`."""
    probs = (counts.astype(np.float64) + 1.0) / (counts.sum() + counts.size)
    return float(np.exp(-np.mean(np.log(probs[tokens.reshape(-1)]))))


class _Run:
    """The state of one training run; methods are the phases of `train_and_evaluate`."""

    def __init__(self, config, workdir: str, devices=None):
        config = blocks.complete(config)  # a config without base_config's newer fields too
        devices = jax.devices() if devices is None else list(devices)
        if len(devices) != jax.device_count() and jax.process_count() > 1:
            raise ValueError("devices: a multi-host run trains on every device of every host")
        # Before anything is built: a bad field is one line, not a traceback after the work.
        data, fsdp, tensor = meshlib.mesh_shape(config.mesh, len(devices))
        validate.check_config(config, data * fsdp, jax.process_count(), tensor)
        self.config, self.workdir = config, prepare_workdir(workdir)
        model = factory.build_model(config.model)
        self.is_lead = jax.process_index() == 0
        # Model, optimiser, abstract state, shardings and jitted steps: `setup.build`, as AOT
        # and the bench build them. Data-parallel over data x fsdp, weights gathered once per step.
        self.setup = setup.build(config, meshlib.make_mesh(config.mesh, devices), model=model)
        self.model, self.mesh = model, self.setup.mesh
        # The learning rate each logged row reports, one compiled program: calling the optax
        # schedule op by op cost about 20 ms of host time per logged step.
        self.lr_at = jax.jit(self.setup.schedule)
        self.train_step, self.eval_step = self.setup.train_step, self.setup.eval_step
        t = config.train
        self.ckpt = Checkpointer(
            self.workdir,
            keep=t.keep_checkpoints,
            keep_best=t.keep_best or None,
            async_save=t.async_checkpoints,
        )
        self.tokens_per_step = t.batch_size * t.seq_len

    def say(self, text: str) -> None:
        """A line of the lead host's log (`progress.say`: stderr, with the progress)."""
        if self.is_lead:
            progress.say(text)

    # ---------------------------------------------------------------- state
    def init_or_restore(self):
        run = self.setup
        data_state = position = None
        continued = init_from.parse(self.config.train.init_from)  # a bad spec stops here
        if continued and not self.ckpt.all_steps():  # a fresh run: before the data and tokenizer
            init_from.check_found(continued[1])
        # The data first: a bad corpus or tokenizer is reported before anything compiles.
        source = pipeline.read(pipeline.DataConfig.of(self.config), workdir=self.workdir)
        if self.ckpt.all_steps():
            step, state, data_state, _, _ = self.ckpt.restore_latest_good(
                run.state_target(), quarantine=True, check_config=self._check_same_model
            )
            logging.info("resumed from step %d in %s", step, self.ckpt.directory)
            # every host says it (a pod's per-host job logs each show the resume)
            progress.say(f"Resuming from checkpoint step {step} in {self.ckpt.directory}")
            self.state = ts.TrainState(*state) if not isinstance(state, ts.TrainState) else state
            init_from.note_resumed(self.config, step, self.ckpt.directory)
        elif continued:
            self.state, position = init_from.paper_state(
                self.config, run.abstract_state, run.state_shardings
            )
        else:
            self.state = run.init_state(jax.random.PRNGKey(self.config.seed))
        self.data = source.open(data_state, jax.process_index(), jax.process_count())
        if position is not None:  # the paper run's place in its bin: shards
            init_from.seek_data(self.data.train, position, self.config)
        if self.config.train.carry_state:  # resets need the data's separator
            self.train_step = run.stateful_train_step(self.data.eos_id)
        t = self.config.train
        # heldout_fraction=0 keeps no held-out set: train, skip every evaluation.
        self.has_heldout = len(self.data.heldout) >= t.batch_size * t.seq_len
        return self

    def _check_same_model(self, saved_config: dict) -> None:
        """Called with a checkpoint's config before its arrays are read: another model is
        reported as such (one line), not as an unreadable checkpoint."""
        current = json.loads(json.dumps(self.config.model.to_dict()))
        differ = model_difference(saved_config.get("model", {}), current)
        if differ:
            raise TrainingError(
                f"checkpoint in {self.ckpt.directory} is of another model: {differ}; "
                "use a fresh --workdir"
            )

    # ---------------------------------------------------------------- steps
    def save(self, step: int, metrics: dict | None = None, force: bool = False):
        meta = {"step": step, "tokens_seen": step * self.tokens_per_step}
        meta["tokenizer_sha256"] = tokenizer_sha256(self.data.tokenizer)  # readers check it
        self.ckpt.save(
            step,
            self.state,
            self.data.train.get_state(),
            self.config.to_dict(),
            meta,
            metrics=metrics,
            force=force,
        )

    def save_once(self, step: int, metrics: dict | None = None):
        """Saves `step` unless a checkpoint of it exists already, and waits until it is written."""
        self.ckpt.wait_until_finished()  # a save of this very step may still be in flight
        if step not in self.ckpt.all_steps():
            self.save(step, metrics, force=True)
            self.ckpt.wait_until_finished()

    def evaluate(self, max_batches: int, stride: int = 1) -> dict:
        return evaluate_heldout(
            self.eval_step, self.state.params, self.data, self.mesh, max_batches, stride
        )


def _check_finite(step: int, metrics: dict, ckpt: Checkpointer) -> dict:
    """Host copy of a step's metrics; stops the run if the step was rejected as non-finite.

    The jitted step already kept the previous state (`train_step.keep_if_finite`), so every
    checkpoint, saved before or after, holds finite values only.
    """
    host = {k: float(v) for k, v in jax.device_get(metrics).items()}
    finite = host.pop(ts.FINITE, 1.0)
    if not finite or not math.isfinite(host["loss"]):
        ckpt.wait_until_finished()
        latest = ckpt.newest_intact_step()
        kept = (
            f"newest checkpoint (all values finite): step {latest} in {ckpt.directory}, "
            "its files matching their checksums"
            if latest is not None
            else "no intact checkpoint"
        )
        raise TrainingError(
            f"step {step} is not finite (loss {host['loss']}, grad norm {host['grad_norm']}); "
            f"stopped without applying it; {kept}"
        )
    return host


def _loop(run: _Run, stop: StopSignal, compiled=lambda: None) -> int:
    """The training loop proper; returns the step it ended on. `compiled()` is called once the
    first step has compiled and run."""
    t = run.config.train
    step = int(run.state.step)
    log = _training_log(run, step)
    window, pending = [], None
    first = step
    # Metrics are read one step late (the host never stalls dispatch), unless the step ran
    # inline: then it has finished already, and reading it now times it as its own step.
    lag = not (cpu_steps_inline() and run.mesh.size == 1 and jax.default_backend() == "cpu")
    run.lr_at(step)  # compiled now, in the compile's time, not in the second row's window

    def settle(pending):
        """Reads a step's metrics: the step has finished, by the time its call returned if it
        had finished then, else now (`progress.Throughput`)."""
        nonlocal window
        s, metrics, done_at = pending
        window.append(_check_finite(s, metrics, run.ckpt))
        done_at = log.timer.clock() if done_at is None else done_at
        log.settled(s, done_at)
        if s % t.log_every and s != t.steps:
            return
        row = {k: float(np.mean([m[k] for m in window])) for k in window[0]}
        # Step s's update used schedule(s - 1): optax counts the updates done before it.
        row |= {"lr": float(run.lr_at(s - 1)), **log.measure(s, done_at)}
        run.writer.write(s, row)
        log.row(s, row)
        window = []

    while step < t.steps and not stop.requested:
        _reset_carry_at_epoch_start(run, step)
        batch = meshlib.put_batch(next(run.data.train), run.mesh)
        if step == first:
            log.compile_started(step + 1)
            started = log.timer.clock()
        run.state, metrics = run.train_step(run.state, batch)
        if step == first:  # this call compiled the step: the heap around steps (`host_memory`)
            log.compile_done(log.timer.clock() - started)
            compiled()
            steady_step_memory(t.reuse_step_memory)
        step += 1
        log.dispatched()
        if pending is not None:
            settle(pending)
        pending = (step, metrics, _finished_at(metrics, log.timer.clock))
        boundary = step == t.steps or step % t.checkpoint_every == 0
        evaluating = run.has_heldout and t.eval_every and step % t.eval_every == 0
        if boundary or evaluating or not lag:
            settle(pending)
            pending = None
        _evaluate_and_save(run, log, step, evaluating, boundary)
        stop.should_stop(step)
    if pending is not None:
        settle(pending)
    log.close()
    return step


def _evaluate_and_save(run: _Run, log, step: int, evaluating: bool, boundary: bool) -> None:
    """A step's held-out evaluation and checkpoint, each paused out of the throughput."""
    ckpt_metrics = None
    if evaluating:
        with log.paused("evaluations"):
            ev = run.evaluate(run.config.train.eval_batches)
        run.writer.write(step, {"heldout_loss": ev["loss"], "heldout_ppl": ev["ppl"]})
        log.heldout(step, ev["loss"], ev["ppl"])
        ckpt_metrics = {"heldout_loss": ev["loss"]}
    if boundary:
        with log.paused("checkpoints"):
            run.save(step, ckpt_metrics)


def _finished_at(metrics: dict, clock) -> float | None:
    """The clock now if the step of `metrics` has already finished (its call ran it: XLA:CPU),
    else None. Its metrics may be read only after the next step has run, and, at a checkpoint,
    right after the previous step's: the time it finished must not be the time they are read."""
    loss = metrics.get("loss")
    return clock() if loss is not None and loss.is_ready() else None


def _training_log(run: _Run, step: int) -> progress.TrainingLog:
    """The lead host's log (`training.progress`); MFU where `config.logging.peak_flops` (one
    device's peak FLOP/s) is set."""
    cfg, t = run.config.logging, run.config.train
    peak = float(cfg.peak_flops or 0) * run.mesh.size
    return progress.TrainingLog(
        t.steps,
        step,
        run.tokens_per_step,
        bar=cfg.progress_bar,
        enabled=run.is_lead,
        flops_per_token=run.model.flops_per_token(t.seq_len)["train"] if peak else 0.0,
        peak_flops=peak,
    )


def _reset_carry_at_epoch_start(run: _Run, step: int) -> None:
    """Stateful training: when the streams start over (a new epoch), each row's next window
    is the start of its stream, not the continuation of the last one, so the carry restarts
    (a function of the data position alone, so a resumed run does the same)."""
    if run.state.carry is None or not step or not run.data.train.at_epoch_start:
        return
    run.state = run.state._replace(carry=run.setup.fresh_carry())


def train_and_evaluate(config, workdir: str, devices=None) -> dict:
    """Trains `config` in `workdir` (resuming if it holds a checkpoint) and evaluates held-out PPL.

    `devices` (a single-host run only) trains on those devices instead of all of
    `jax.devices()`, e.g. `jax.devices()[:1]` for one chip of a TPU host in Colab; `config.mesh`
    lays the run out over them (-1: the devices left).

    Returns the final metrics (also written to `<workdir>/final_metrics.json`), or
    `{'stopped_at': step, 'signal': 'SIGTERM' or 'SIGINT'}` if a signal stopped the run (after
    saving a checkpoint).
    """
    run = _Run(config, workdir, devices)
    run.say(_header(run))  # the first line: before the data is read and the state built
    try:
        with jax.set_mesh(run.mesh):
            return _train(run.init_or_restore())
    finally:
        run.ckpt.release_lock()  # also when the run fails before `_train` closes it


def _train(run: _Run) -> dict:
    run.writer = _metric_writer(run)
    run.say(f"data: {run.data.description}")
    stop = StopSignal()
    # Until the first step has compiled and run nothing is trained and nothing is to be saved:
    # Ctrl-C in a command exits at once, not after the compile (XLA's: minutes on a pod).
    start_up = contextlib.ExitStack()
    start_up.enter_context(cli.interrupt_exits_at_once())
    try:
        step = _loop(run, stop, start_up.close)
        if stop.requested:
            run.save_once(step)
            progress.say(  # stdout, as the result; stamped where it goes to a file
                f"{stop.name}: saved step {step} in {run.ckpt.directory}; rerun the command to "
                "resume",
                sys.stdout,
            )
            return {"stopped_at": step, "signal": stop.name}
        final = _finish(run, step)
    finally:
        start_up.close()
        stop.restore()
        run.ckpt.wait_until_finished()
        run.ckpt.close()
        run.writer.close()
    return final


def _metric_writer(run: _Run) -> MetricWriter:
    """The writers of `config.logging` (process 0 only), each first told the run's info."""
    if not run.is_lead:
        return MetricWriter(run.workdir, enabled=False)
    return MetricWriter(
        run.workdir,
        writers=parse_writers(run.config),
        info=run_info(run.config, run.workdir)
        | {"cpu_steps_inline": cpu_steps_inline(), "kernels": run.setup.kernels}
        # the Pallas self-checks on this run's devices
        | {"kernel_checks": selfcheck.recorded(run.mesh.devices.flat[0].platform)},
        wandb_project=run.config.logging.wandb_project,
    )


def _finish(run: _Run, step: int) -> dict:
    final = {"step": step, "tokens_seen": step * run.tokens_per_step}
    if run.has_heldout:
        t = run.config.train
        ev = run.evaluate(t.final_eval_batches, t.final_eval_stride)
        final = {
            "heldout_ppl": ev["ppl"],
            "heldout_loss": ev["loss"],
            "unigram_ppl": unigram_ppl(run.data.unigram_counts, ev["tokens"]),
            "heldout_tokens": int(ev["tokens"].size),
            **final,
        }
        run.save_once(step, {"heldout_loss": ev["loss"]})
        summary = (
            f"held-out PPL {final['heldout_ppl']:.2f} vs unigram PPL "
            f"{final['unigram_ppl']:.2f} ({final['heldout_tokens']:,} held-out tokens)"
        )
    else:
        final |= {"heldout_tokens": 0, "heldout": "none kept (data.heldout_fraction=0)"}
        run.save_once(step)
        summary = "no held-out set was kept (data.heldout_fraction=0), so no held-out PPL"
    if run.is_lead:
        paths.write_bytes(
            paths.join(run.workdir, FINAL_METRICS), json.dumps(final, indent=2).encode()
        )
        progress.say(f"step {step}: {summary}", sys.stdout)
    return final


def _header(run: _Run) -> str:
    """'<family> model, N parameters | data <source> | batch B x T, S steps | mesh .. | workdir ..'."""
    counts = accounting.param_counts(run.model)["total"]
    c, t = run.config, run.config.train
    return (
        f"{factory.family_name(c.model)} model, {counts:,} parameters | "
        f"data {c.data.source} | "
        f"batch {t.batch_size} x {t.seq_len}, {t.steps} steps | "
        f"mesh {dict(run.mesh.shape)} | workdir {run.workdir}"
    )
