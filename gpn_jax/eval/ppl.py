"""Held-out perplexity: the training loss definition over training's own held-out windows.

Every window is scored from a fresh state (as training scores it) and every position counts,
so the result is exactly `exp(mean model.loss)` over the held-out windows.
"""

import functools
import math

import jax
import numpy as np


def windows_ppl(model, params, windows, max_batches: int = 0) -> dict:
    """Mean `model.loss` over (B, T) batches of `windows`, weighted by tokens.

    Args:
      windows: an iterable of (B, T) int arrays (e.g. `Data.heldout_windows()`).
      max_batches: stop after this many batches (0: all).

    Returns:
      {'loss', 'ppl', 'tokens', 'windows', 'seq_len'}.
    """
    loss_fn = _jitted_loss(model)
    total, tokens, rows, seq_len = 0.0, 0, 0, 0
    for i, batch in enumerate(windows):
        if max_batches and i >= max_batches:
            break
        batch = np.asarray(batch, np.int32)
        total += float(loss_fn(params, batch)) * batch.size
        tokens, rows, seq_len = tokens + batch.size, rows + batch.shape[0], batch.shape[1]
    if not tokens:
        raise ValueError("no held-out windows to evaluate")
    loss = total / tokens
    return {
        "loss": loss,
        "ppl": math.exp(loss),
        "tokens": tokens,
        "windows": rows,
        "seq_len": seq_len,
    }


@functools.lru_cache(maxsize=8)
def _jitted_loss(model):
    return jax.jit(lambda p, x: model.loss(p, x)[0])


def heldout_data(run, cache_dir: str | None = None):
    """The run's data rebuilt exactly as training built it (same split, tokenizer, windows),
    without writing into its workdir (`RestoredRun.data`)."""
    return run.data(cache_dir)


def heldout_ppl(run, data=None, max_batches: int = 0) -> dict:
    """Held-out PPL of a restored run over training's held-out windows."""
    data = heldout_data(run) if data is None else data
    return windows_ppl(run.model, run.params, data.heldout_windows(), max_batches)
