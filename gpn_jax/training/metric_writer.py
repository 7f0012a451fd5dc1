"""Metrics to `<workdir>/metrics.jsonl` and TensorBoard event files (tensorboardX).

Only process 0 writes; other processes get a writer that does nothing. The workdir may be a
`gs://` URL (`gpn_jax.training.paths`): then both files are rewritten objects.
"""

import json
import time

from tensorboardX import SummaryWriter

from gpn_jax.training import paths


class MetricWriter:
    def __init__(self, workdir: str, enabled: bool = True):
        self.enabled = enabled
        if not enabled:
            return
        self._jsonl = paths.open_append(paths.join(workdir, "metrics.jsonl"))
        paths.register_tensorboard(workdir)
        self._tb = SummaryWriter(paths.join(workdir, "tensorboard"))

    def write(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        scalars = {k: float(v) for k, v in metrics.items()}
        self._jsonl.write(json.dumps({"step": int(step), "time": time.time(), **scalars}) + "\n")
        for k, v in scalars.items():
            self._tb.add_scalar(k, v, int(step))

    def flush(self) -> None:
        if self.enabled:
            self._jsonl.flush()
            self._tb.flush()

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            self._tb.close()
