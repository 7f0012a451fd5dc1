"""Running `gpn_jax.train` as a subprocess, and checking its one-line errors."""

import os
import re
import subprocess
import sys

from tests.environment import one_device_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = "experiments/configs/gpn_m_tiny.py"


def train_cmd(workdir, *flags, config=TINY):
    return [
        sys.executable,
        "-m",
        "gpn_jax.train",
        f"--config={config}",
        f"--workdir={workdir}",
        *flags,
    ]


def run_train(workdir, *flags, config=TINY, timeout=300, fast_compile=True):
    env = one_device_env(fast=fast_compile)
    return subprocess.run(
        train_cmd(workdir, *flags, config=config),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


# the run's own log lines, time-stamped when stderr is a pipe (its header, `data:`, ...)
RUN_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")


def assert_one_line_error(proc, pattern, workdir=None):
    """A refusal: non-zero exit, and besides the run's own time-stamped log lines (its header
    comes before the data is read) exactly one line, the error."""
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not RUN_LOG_LINE.match(ln)]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gpn-train: error: "), lines[0]
    assert pattern in lines[0], lines[0]
    if workdir is not None:  # nothing partial was checkpointed
        ckpts = os.path.join(workdir, "checkpoints")
        assert not os.path.isdir(ckpts) or not os.listdir(ckpts)
