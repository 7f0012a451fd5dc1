"""What every synthetic task generator returns, and the helpers they share.

A task is a batch of examples `(inputs, labels, mask)`, three (N, T) arrays: `inputs` int32
token ids (the only thing a model reads), `labels` int32 the answer key, `mask` bool the
answer positions. The model's prediction at position t is made after reading inputs[0..t]
and is scored against labels[t] where mask[t] is True; nothing else is scored or trained on.
Labels are a separate array, never a shifted copy inside the inputs, so a task whose answer
is a hidden state (parity, S5) cannot leak it into the stream. Ids are task-native (from 0);
the harness maps them into a model vocabulary.

Every array is a deterministic function of (task parameters, seed, split): `rng` below.
"""

from typing import NamedTuple

import numpy as np

SPLITS = {"train": 0, "valid": 1, "test": 2}


class Examples(NamedTuple):
    """(N, T) inputs (int32), labels (int32, 0 where unscored) and the answer mask (bool)."""

    inputs: np.ndarray
    labels: np.ndarray
    mask: np.ndarray


def rng(seed: int, split: str, *extra: int) -> np.random.Generator:
    """The random stream of one split (extra ints: e.g. a test length) of a task seed."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {sorted(SPLITS)}")
    return np.random.default_rng([seed, SPLITS[split], *extra])


def from_next_token(tokens: np.ndarray, answers: np.ndarray) -> Examples:
    """A next-token task (recall, copying) as labels: the answer at token t+1 becomes the
    label of position t, the position that predicts it after reading tokens[0..t]."""
    tokens = np.asarray(tokens, np.int32)
    labels = np.zeros_like(tokens)
    labels[:, :-1] = tokens[:, 1:]
    mask = np.zeros(tokens.shape, bool)
    mask[:, :-1] = np.asarray(answers, bool)[:, 1:]
    return Examples(tokens, np.where(mask, labels, 0).astype(np.int32), mask)


def check_positive(**values) -> None:
    """One-line ValueError naming the first value that is not a positive int."""
    for name, v in values.items():
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
