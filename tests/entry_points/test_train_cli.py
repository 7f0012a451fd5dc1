"""The `gpn_jax.train` command: one-line errors on bad input, SIGTERM, a failed checkpoint
write (the README's main job is tests/entry_points/test_first_run.py's)."""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

from gpn_jax.data.tokenizer import train_tokenizer
from tests.data.corpus_files import write_corpus, write_manifest
from tests.environment import one_device_env, xla_flags
from tests.helpers.cli import RUN_LOG_LINE, TINY, assert_one_line_error, run_train, train_cmd

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_empty_corpus(tmp_path):
    """(A missing corpus's message: tests/training/test_training.py's
    test_bad_data_is_reported_before_the_state_is_built; read at the same stage as this one.)"""
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    proc = run_train(tmp_path / "w", f"--config.data.source={empty}")
    assert_one_line_error(proc, "empty", tmp_path / "w")


def test_object_dtype_manifest_is_one_line_not_a_segfault(tmp_path):
    """Issue 45 item 1: `"dtype": "O"` in a prepared corpus's manifest crashed with exit 139."""
    manifest = write_corpus(tmp_path / "corpus")
    write_manifest(tmp_path / "corpus", dict(manifest, dtype="O"))
    proc = run_train(tmp_path / "w", f"--config.data.source=bin:{tmp_path / 'corpus'}")
    assert proc.returncode == 1
    assert_one_line_error(proc, "manifest.json: dtype 'O' is not one of uint16, uint32")


def test_unknown_config_field(tmp_path):
    proc = run_train(tmp_path / "w", "--config.train.stpes=3")
    assert_one_line_error(proc, "unknown config field or bad value in --config.train.stpes=3")


def test_unknown_metric_writer(tmp_path):
    proc = run_train(tmp_path / "w", "--config.logging.writers=jsonl,csv")
    assert_one_line_error(proc, "unknown metric writer 'csv'", tmp_path / "w")


def test_unknown_dataset(tmp_path):
    proc = run_train(tmp_path / "w", "--config.data.source=tfds:no_such_dataset_xyz")
    assert_one_line_error(proc, "no_such_dataset_xyz", tmp_path / "w")


def test_non_writable_workdir(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    proc = run_train(blocker / "run")
    assert_one_line_error(proc, "is not writable")


def test_tokenizer_vocab_mismatch(tmp_path):
    tok = str(tmp_path / "tok290.model")
    train_tokenizer(["a small corpus of words, letters and digits 0123456789."] * 50, 290, tok)
    proc = run_train(tmp_path / "w", f"--config.data.tokenizer_path={tok}")
    assert_one_line_error(proc, "vocab", tmp_path / "w")


def test_sequence_not_divisible_by_remat_segment(tmp_path):
    proc = run_train(tmp_path / "w", "--config.model.remat_segment=5")
    assert_one_line_error(
        proc, "sequence length 32 is not divisible by the remat segment 5", tmp_path / "w"
    )


# The training runs of this module share one train-step program, compiled once (JAX's compile
# cache): one batch size, and a warm-up past every run's end, so that the LR schedule (decay
# over max(steps, warmup + 1) steps) does not depend on `train.steps`. The final evaluation
# reads one held-out batch (not all 45): these tests check checkpoints, not the PPL.
ONE_PROGRAM = (
    "--config.train.batch_size=8",
    "--config.train.warmup_steps=100000",
    "--config.train.final_eval_batches=1",
)


def test_sigterm_saves_and_exits_cleanly_then_resumes(tmp_path):
    workdir = tmp_path / "w"
    flags = ["--config.train.steps=100000", "--config.train.log_every=1", *ONE_PROGRAM]
    env = one_device_env()
    proc = subprocess.Popen(
        train_cmd(workdir, *flags),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = workdir / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and not (
        metrics.exists() and metrics.read_text().count('"loss"') >= 3  # rows after run_info
    ):
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "SIGTERM: saved step" in out
    step = int(out.split("SIGTERM: saved step ")[1].split()[0])
    assert step >= 3 and os.path.isdir(workdir / "checkpoints" / str(step))
    again = run_train(workdir, f"--config.train.steps={step + 2}", *ONE_PROGRAM)
    assert again.returncode == 0, again.stderr
    assert f"Resuming from checkpoint step {step}" in again.stderr  # with the progress
    assert json.loads((workdir / "final_metrics.json").read_text())["step"] == step + 2


@pytest.mark.slow
def test_sigint_while_stepping_saves_and_exits_non_zero_in_one_line(tmp_path):
    """Ctrl-C (issue 83) is handled like SIGTERM, but the command did not finish: exit 130."""
    workdir = tmp_path / "w"
    flags = ["--config.train.steps=100000", "--config.train.log_every=1", *ONE_PROGRAM]
    proc = subprocess.Popen(train_cmd(workdir, *flags), cwd=ROOT, env=one_device_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    metrics = workdir / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and not (
        metrics.exists() and metrics.read_text().count('"loss"') >= 2
    ):
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    step = int(out.split("SIGINT: saved step ")[1].split()[0])
    assert os.path.isdir(workdir / "checkpoints" / str(step))


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["gpn model,", "compiling the training step"])
def test_sigint_in_start_up_or_the_first_compile_exits_at_once_in_one_line(tmp_path, moment):
    """Ctrl-C (issue 83) after the run's header (reading the data, building the state) or
    while the first step compiles: nothing is trained yet, so nothing is saved; the command
    says `gpn-train: interrupted` and exits 130 at once (the compile is not waited for), with
    no traceback and no crash (it was a KeyboardInterrupt traceback, then exit 139)."""
    workdir = tmp_path / "w"
    env = one_device_env(JAX_COMPILATION_CACHE_DIR=str(tmp_path / "xla_cache"))  # a real compile
    proc = subprocess.Popen(train_cmd(workdir, "--config.train.steps=5"), cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if moment in line:
            proc.send_signal(signal.SIGINT)
            break
    out, err = proc.communicate(timeout=120)
    err = "".join(seen) + err
    assert proc.returncode == 130, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.strip() and not RUN_LOG_LINE.match(ln)]
    assert lines == ["gpn-train: interrupted"], err[-3000:]
    assert "compiled the training step" not in err and "saved step" not in out, err + out
    ckpts = workdir / "checkpoints"
    assert not ckpts.exists() or not os.listdir(ckpts)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--config.model.d_model=-1"], "config.model.d_model must be a positive integer, got -1"),
        (["--config.model.vocab_size=0"], "config.model.vocab_size must be a positive integer"),
        (["--config.train.seq_len=0"], "config.train.seq_len must be a positive integer, got 0"),
        (["--config.train.steps=0"], "config.train.steps must be a positive integer, got 0"),
        (["--config.train.checkpoint_every=0"], "config.train.checkpoint_every must be a positive"),
        (["--config.train.batch_size=0"], "config.train.batch_size must be a positive integer"),
        (
            ["--config.train.batch_size=6", "--config.train.grad_accum=4"],
            "config.train.batch_size must be a multiple of config.train.grad_accum (4), got 6",
        ),
        (
            ["--config.train.batch_size=3"],  # two devices below: data-parallel size 2
            "config.train.batch_size must be a multiple of grad_accum x data-parallel devices "
            "(data x fsdp) = 1 x 2, got 3",
        ),
        (
            ["--config.train.eval_every=3", "--config.train.checkpoint_every=7"],
            "config.train.keep_best=1 needs an evaluation on a checkpoint step",
        ),
        (["--config.data.heldout_fraction=1.0"], "config.data.heldout_fraction must be in [0, 1)"),
        (["--config.train.min_lr_ratio=-0.5"], "config.train.min_lr_ratio must be in [0, 1]"),
        (["--config.train.grad_clip=-1.0"], "config.train.grad_clip must be > 0"),
        (["--config.model.compute_dtype=float7"], "config.model.compute_dtype must be one of"),
        (["--config.logging.writers="], "config.logging.writers is empty"),
    ],
    ids=lambda v: v[0] if isinstance(v, list) else None,
)
def test_bad_config_fails_before_any_work(tmp_path, flags, message):
    """One line naming the field; nothing trained, prepared or compiled (a fresh compilation
    cache that caches every compile stays empty)."""
    cache = tmp_path / "xla_cache"
    env = dict(
        one_device_env(),
        XLA_FLAGS=xla_flags(devices=2),
        JAX_COMPILATION_CACHE_DIR=str(cache),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    )
    workdir = tmp_path / "w"
    proc = subprocess.run(
        train_cmd(workdir, *flags), cwd=ROOT, capture_output=True, text=True, timeout=120, env=env
    )
    assert_one_line_error(proc, message)
    assert not (workdir / "tokenizer.model").exists() and not (workdir / "data_cache").exists()
    assert not cache.exists() or not os.listdir(cache)


# Runs `python -m gpn_jax.train` in-process, then says whether anything imported JAX.
_JAX_PROBE = (
    "import runpy, sys\n"
    "try:\n"
    "    runpy.run_module('gpn_jax.train', run_name='__main__', alter_sys=True)\n"
    "finally:\n"
    "    print('jax imported:', 'jax' in sys.modules)\n"
)


# Config files with a mistake in them, for the cases below ({tmp}/NAME).
BAD_CONFIGS = {
    "syntax.py": "def get_config(:\n",
    "raises.py": "import os\nraise RuntimeError('boom')\n",
    "no_get_config.py": "x = 1\n",
    "variant.py": "def get_config(arg=None):\n    raise ValueError(f'no variant {arg!r}')\n",
}
OVERRIDE = "--config.train.steps=2"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--config.model.d_model=-1"], "config.model.d_model must be a positive integer, got -1"),
        (["--config.train.stpes=3"], "unknown config field or bad value in --config.train.stpes"),
        (["--config=/no/such/config.py"], "--config=/no/such/config.py: no such file; give a"),
        # issue 84: each of these with an override was a traceback of 50-65 lines
        (["--config=experiments/configs/dmeo.py", OVERRIDE], "configs/dmeo.py: no such file"),
        ([OVERRIDE], "--config.train.steps=2 overrides a field of --config, which is not given"),
        (["--config={tmp}/syntax.py", OVERRIDE], "syntax.py: line 1: invalid syntax (SyntaxError)"),
        (["--config={tmp}/syntax.py"], "syntax.py: line 1: invalid syntax (SyntaxError)"),
        (["--config={tmp}/raises.py", OVERRIDE], "raises.py: line 2: RuntimeError: boom"),
        (["--config={tmp}/no_get_config.py", OVERRIDE], "no_get_config.py: the file defines no"),
        (["--config={tmp}/variant.py:x", OVERRIDE], "variant.py:x: line 2: ValueError: no variant"),
        ([f"--config={TINY}:nosuch", OVERRIDE], "ValueError: unknown config variant 'nosuch'"),
        (["--config={tmp}", OVERRIDE], "is a directory; give a config file"),
        (["--config=", OVERRIDE], "--config is empty; give a config file"),
    ],
    ids=[
        "bad value", "unknown field", "missing file", "mistyped + override", "override alone",
        "syntax error + override", "syntax error", "raises + override", "no get_config",
        "variant raises", "unknown variant", "directory", "empty",
    ],
)  # fmt: skip
def test_config_errors_never_import_jax(tmp_path, flags, message):
    """A config mistake is reported before JAX and the training stack are imported (seconds)."""
    for name, text in BAD_CONFIGS.items():
        (tmp_path / name).write_text(text)
    flags = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    alone = flags == [OVERRIDE]  # the override without a --config
    config = [] if alone or any(f.startswith("--config=") for f in flags) else [f"--config={TINY}"]
    argv = [*config, f"--workdir={tmp_path / 'w'}", *flags]
    proc = subprocess.run(
        [sys.executable, "-c", _JAX_PROBE, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=one_device_env(),
    )
    assert_one_line_error(proc, message)
    assert "jax imported: False" in proc.stdout, proc.stdout


def _limit_between_logs_and_checkpoint(workdir, step) -> int:
    """A file-size limit (KiB) that every log / metrics file the rerun appends to stays under
    and that the checkpoint's tree metadata file (`_METADATA`, one file whose size depends only
    on the parameter tree, unlike OCDBT's data files, whose split varies run to run) exceeds."""
    logs = [f for f in workdir.rglob("*") if f.is_file() and "checkpoints" not in f.parts]
    logs = [f for f in logs if "data_cache" not in f.parts]  # cached, never rewritten
    limit_kib = max(f.stat().st_size for f in logs) // 1024 + 4
    metadata = workdir / "checkpoints" / str(step) / "state" / "_METADATA"
    assert metadata.stat().st_size > 1024 * limit_kib, "premise: a checkpoint file over the limit"
    return limit_kib


@pytest.mark.slow
def test_failed_checkpoint_write_is_one_line(tmp_path):
    """A save that hits EFBIG (as a full disk would) ends the run with one line naming the
    step and path; no half-written step is listed and every listed step restores."""
    workdir = tmp_path / "w"
    flags = ["--config.train.steps=4", "--config.train.checkpoint_every=2", *ONE_PROGRAM]
    first = run_train(workdir, *flags, "--config.train.eval_every=0")
    assert first.returncode == 0, first.stderr
    limit_kib = _limit_between_logs_and_checkpoint(workdir, step=4)
    shutil.rmtree(workdir / "checkpoints" / "4")  # rerun resumes at 2 and saves 4 again

    # Writes over `limit_kib` fail with EFBIG (SIGXFSZ ignored), as on a full or quota'd disk.
    # Set by the shell around exec, not preexec_fn: forking the multithreaded JAX test process
    # and running Python in the child can deadlock.
    cmd = " ".join(
        shlex.quote(a) for a in train_cmd(workdir, *flags, "--config.train.eval_every=0")
    )
    proc = subprocess.run(
        ["bash", "-c", f"trap '' XFSZ; ulimit -f {limit_kib}; exec {cmd}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=one_device_env(),
    )
    assert proc.returncode == 1
    progress = re.compile(r"\d+%\||^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")  # the run's log, stamped
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not progress.search(ln)]
    directory = workdir / "checkpoints"
    assert lines == [
        f"gpn-train: error: cannot write checkpoint step 4 to {directory}/4: File too large "
        "(EFBIG); its unfinished files were removed; newest complete checkpoint: step 2"
    ], proc.stderr[-3000:]
    assert sorted(os.listdir(directory)) == ["2"]
    again = run_train(workdir, *flags, "--config.train.eval_every=0")  # no limit: resumes
    assert again.returncode == 0, again.stderr
    assert "Resuming from checkpoint step 2" in again.stderr
