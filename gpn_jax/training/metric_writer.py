"""Training metrics to the writers a run's `config.logging.writers` names.

    jsonl        <workdir>/metrics.jsonl, one JSON object a line (what gpn_jax's own tools read)
    tensorboard  <workdir>/tensorboard/ event files, through tensorboardX
    wandb        Weights & Biases through the `wandb` package (extra `gpn_jax[wandb]`), its files
                 in <workdir>/wandb/; offline unless WANDB_API_KEY (or WANDB_MODE) says otherwise

Each run session first records its `run_info` (config, git revision, package version, argv):
a `{"run_info": ...}` line in metrics.jsonl, `run_info/*` text in TensorBoard, the run config
plus `git_revision` in wandb's config. Only process 0 writes; other processes get a writer that
does nothing. The workdir may be a `gs://` URL (`gpn_jax.io.paths`): then metrics.jsonl
and the event files are rewritten objects (object stores cannot append).

Library choice: TensorBoard through tensorboardX and W&B through wandb, not hand-written. CLU's
`metric_writers` would give one interface over both, but its package `__init__` imports its
TensorFlow summary writer, i.e. TensorFlow, which gpn_jax does not otherwise need (tfds runs
without it); the JSONL writer is one json.dumps a line.
"""

import json
import os
import secrets
import subprocess
import sys
import time

from gpn_jax.io import paths
from gpn_jax.io.files import atomic_write
from gpn_jax.io.provenance import package_version
from gpn_jax.io.regular import read_regular_file
from gpn_jax.training.validate import check_logging


def parse_writers(config) -> list[str]:
    """The writer names of `config.logging.writers`, each once, after `validate.check_logging`
    (a one-line ValueError for an empty list, an unknown writer, or wandb not installed)."""
    check_logging(config)
    names = [n.strip() for n in config.logging.writers.split(",") if n.strip()]
    return list(dict.fromkeys(names))


def git_revision() -> str:
    """HEAD of the checkout gpn_jax runs from ('-dirty' if it has local changes), or 'unknown'."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                              text=True, timeout=10)  # fmt: skip
        if head.returncode:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=here, capture_output=True, text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def run_info(config, workdir: str) -> dict:
    """What identifies a run session: its config, code revision, package version and command."""
    return {
        "git_revision": git_revision(),
        "gpn_jax_version": package_version(),
        "argv": list(sys.argv),
        "workdir": workdir,
        "config": json.loads(json.dumps(config.to_dict(), default=str)),
    }


class MetricWriter:
    """Writes scalar rows to every configured writer."""

    def __init__(self, workdir: str, enabled: bool = True, writers=("jsonl", "tensorboard"),
                 info: dict | None = None, wandb_project: str = "gpn_jax"):  # fmt: skip
        self.enabled = enabled
        self._jsonl = self._tb = self._wandb = None
        if not enabled:
            return
        info = info or {}
        if "jsonl" in writers:
            self._jsonl = paths.open_append(paths.join(workdir, "metrics.jsonl"))
            if info:
                self._jsonl.write(json.dumps({"run_info": info, "time": time.time()}) + "\n")
        if "tensorboard" in writers:
            from tensorboardX import SummaryWriter

            paths.register_tensorboard(workdir)
            self._tb = SummaryWriter(paths.join(workdir, "tensorboard"))
            for key in ("git_revision", "gpn_jax_version", "argv", "config"):
                if key in info:
                    text = json.dumps(info[key], indent=2)
                    self._tb.add_text(f"run_info/{key}", f"```\n{text}\n```", 0)
        if "wandb" in writers:
            self._wandb = _start_wandb(workdir, info, wandb_project)

    def write(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        scalars = {k: float(v) for k, v in metrics.items()}
        if self._jsonl:
            row = {"step": int(step), "time": time.time(), **scalars}
            self._jsonl.write(json.dumps(row) + "\n")
        if self._tb:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, int(step))
        if self._wandb:
            self._wandb.log(scalars, step=int(step))

    def flush(self) -> None:
        if self._jsonl:
            self._jsonl.flush()
        if self._tb:
            self._tb.flush()

    def close(self) -> None:
        if self._jsonl:
            self._jsonl.close()
        if self._tb:
            self._tb.close()
        if self._wandb:
            self._wandb.finish()


def _start_wandb(workdir: str, info: dict, project: str):
    """A wandb run whose files live in `<workdir>/wandb`; a resumed training run continues the
    same wandb run (its id is kept in `<workdir>/wandb/gpn_jax_run_id`)."""
    import wandb

    root = os.path.join(workdir, "wandb")
    os.makedirs(root, exist_ok=True)
    id_file = os.path.join(root, "gpn_jax_run_id")
    if os.path.exists(id_file):
        run_id = read_regular_file(id_file, 256).decode("ascii", "replace").strip()
    else:
        run_id = secrets.token_hex(4)  # wandb run ids are [a-z0-9]
        atomic_write(id_file, run_id.encode())
    mode = os.environ.get("WANDB_MODE") or (
        "online" if os.environ.get("WANDB_API_KEY") else "offline"
    )
    config = dict(info.get("config", {}))
    config |= {k: info[k] for k in ("git_revision", "gpn_jax_version") if k in info}
    return wandb.init(
        project=project,
        dir=workdir,
        id=run_id,
        resume="allow",
        name=os.path.basename(workdir.rstrip("/")),
        mode=mode,
        config=config,
        settings=wandb.Settings(console="off", silent=True),
    )
