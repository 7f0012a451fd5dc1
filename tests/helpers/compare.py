"""The compare tests' micro config and a one-CPU-device subprocess runner."""

import os
import subprocess
import sys

import ml_collections

from experiments.configs import compare_tiny
from tests.environment import one_device_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def micro_config() -> ml_collections.ConfigDict:
    """compare_tiny shrunk to seconds per model (vocab 512, width 32, 6 steps of 8 x 32)."""
    c = compare_tiny.get_config()
    small = dict(vocab_size=512, d_model=32, d_ffn=64, loss_chunk=16)
    c.models.gpn_m.update(small | dict(d_emb=16, n_heads=2, d_key=8, d_value=8))
    c.models.gpn.update(small | dict(d_emb=16))
    c.models.transformer.update(small | dict(n_layers=2, n_heads=2))
    c.models.gdn.update(small | dict(n_layers=2, n_heads=2, d_key=8, d_value=8, chunk_size=16))
    c.train.update(
        dict(
            batch_size=8,
            seq_len=32,
            steps=6,
            warmup_steps=2,
            log_every=2,
            eval_every=3,
            eval_batches=1,
            checkpoint_every=6,  # one save per run, at its end: no assertion reads step 3
            async_checkpoints=False,
        )
    )
    return c


def run_one_device(code: str, *args):
    """`python -c code *args` from the repository root on one CPU device; must exit 0."""
    env = one_device_env()
    proc = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc
