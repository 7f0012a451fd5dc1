"""What a cell must beat to count as learnt: chance, and the level a model reaches without the
ability a task tests.

* Recall and copying (`CONTEXT_TASKS`): guessing, at each answer position, uniformly among the
  distinct answer symbols already read (`context_guess`). A model that knows which values
  appeared but not which key they belong to scores this, well above 1 / answer symbols
  (MQAR at T = 64 with 8 pairs: about 0.14 against chance 0.03).
* State tracking: the positions whose label a family computes from the inputs it sees
  directly, without a recurrent state (`direct_positions`): position 0 (its label is its own
  input) for every family, and for Gated DeltaNet every position inside its stacked short
  convolutions' receptive field. At length L, getting k such positions right and guessing
  the rest scores (k + (L - k) x chance) / L (`state_level`); past the training length no
  position is seen directly, so the level there is chance.

A cell is learnt (`learnt`) when its seeds support clearing the level: every seed clears it by
`MIN_MARGIN`, or their mean clears it by the one-sided 95 % Student t bound on the mean
(t x sd / sqrt(n) over n seeds, at least `MIN_MARGIN`). The first covers a cell whose seeds
all clear the level but one jumps far above the others, which widens the t bound.
"""

import numpy as np

from gpn_jax.data.synthetic import Examples
from gpn_jax.models import factory

CONTEXT_TASKS = ("in_context_recall", "noisy_recall", "fuzzy_recall", "mqar", "selective_copying")
MIN_MARGIN = 0.05
# one-sided 95 % quantiles of Student's t by degrees of freedom (n seeds: n - 1)
T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833}
T95_MANY = 1.812  # 10 degrees of freedom; more seeds keep this (slightly wider) bound


def context_guess(ex: Examples) -> float:
    """Expected accuracy of a uniform guess among the distinct answer symbols (ids that are a
    label somewhere in `ex`) present in inputs[0..t], at every answer position t."""
    x, y, m = (np.asarray(a) for a in ex)
    symbols = np.unique(y[m])
    onehot = x[..., None] == symbols  # (N, T, S)
    seen = np.maximum.accumulate(onehot, axis=1)  # symbol s read at or before t
    n_seen = seen.sum(-1)
    idx = np.clip(np.searchsorted(symbols, y), 0, len(symbols) - 1)
    label_seen = np.take_along_axis(seen, idx[..., None], -1)[..., 0] & (symbols[idx] == y)
    guess = np.where(label_seen, 1.0 / np.maximum(n_seen, 1), 0.0)
    return float(guess[m].mean())


def direct_positions(fields: dict) -> int:
    """Leading positions whose full prefix a model block reads without its recurrent state (its
    config's `direct_positions`, GDN's short convolutions; 1 elsewhere)."""
    return getattr(factory.family_config(fields), "direct_positions", 1)


def state_level(chance: float, length: int, direct: int) -> float:
    """(k + (L - k) chance) / L: the first k = `direct` positions right, the rest guessed."""
    k = min(direct, length)
    return (k + (length - k) * chance) / length


def margin(accs) -> float:
    """max(MIN_MARGIN, t95 x sd / sqrt(n)); one seed gives no spread, only MIN_MARGIN."""
    accs = np.asarray(accs, float)
    if accs.size < 2:
        return MIN_MARGIN
    t = T95.get(accs.size - 1, T95_MANY)
    return max(MIN_MARGIN, t * accs.std(ddof=1) / np.sqrt(accs.size))


def learnt(accs, level: float) -> bool:
    """Every seed clears `level` by MIN_MARGIN, or the seeds' mean clears it by `margin`."""
    if not len(accs):
        return False
    every = min(accs) > level + MIN_MARGIN
    return bool(every or np.mean(accs) - margin(accs) > level)


def onset(curve: list, pick: slice, level: float) -> int | None:
    """The first step of a validation curve ([step, every run's accuracy] pairs) at which the
    runs in `pick` are `learnt` above `level`, or None."""
    for step, accs in curve:
        if learnt(accs[pick], level):
            return step
    return None
