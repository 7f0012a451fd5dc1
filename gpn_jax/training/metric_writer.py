"""Metrics to `<workdir>/metrics.jsonl` and TensorBoard event files (tensorboardX).

Only process 0 writes; other processes get a writer that does nothing.
"""

import json
import os
import time

from tensorboardX import SummaryWriter


class MetricWriter:
    def __init__(self, workdir: str, enabled: bool = True):
        self.enabled = enabled
        if not enabled:
            return
        self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a", buffering=1)  # noqa: SIM115
        self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

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
