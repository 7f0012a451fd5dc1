"""Synthetic sequence tasks with exact answer keys: MAD's six (recall, fuzzy and noisy recall,
selective copying, compression, memorisation), Zoology's MQAR, and state tracking (parity,
modular addition, S5). One module per task family; `TASKS` names them for the harness.

Every generator is `fn(n, seq_len, vocab, seed, split, **params) -> Examples` (`base`), pure
numpy, a deterministic function of its arguments. `chance(name, vocab, params)` is the
accuracy of guessing uniformly among the task's answer symbols.
"""

from gpn_jax.data.synthetic import compression, copying, mad_recall, memorisation, mqar, state
from gpn_jax.data.synthetic.examples import Examples

# name -> (generator, number of answer symbols as a function of (vocab, params))
TASKS = {
    "in_context_recall": (mad_recall.in_context_recall, lambda v, p: v - v // 2),
    "fuzzy_recall": (mad_recall.fuzzy_recall, None),
    "noisy_recall": (
        mad_recall.noisy_recall,
        lambda v, p: (v - p.get("noise_vocab", 16)) - (v - p.get("noise_vocab", 16)) // 2,
    ),
    "selective_copying": (copying.selective_copying, lambda v, p: v - 2),
    "compression": (compression.compression, lambda v, p: v - 2),
    "memorisation": (memorisation.memorisation, lambda v, p: (v - 1) // 2),
    "mqar": (mqar.mqar, lambda v, p: (v - 1) // 2),
    "parity": (state.parity, lambda v, p: 2),
    "modular_addition": (state.modular_addition, lambda v, p: v),
    "s5": (state.s5, lambda v, p: 120),
}
STATE_TASKS = ("parity", "modular_addition", "s5")


def generate(name: str, n: int, seq_len: int, vocab: int, seed: int, split: str, **params):
    """`n` examples of task `name` (one-line ValueError for an unknown name)."""
    if name not in TASKS:
        raise ValueError(f"unknown synthetic task {name!r}; choose one of {sorted(TASKS)}")
    return TASKS[name][0](n, seq_len, vocab, seed, split, **params)


def chance(name: str, vocab: int, params: dict) -> float | None:
    """1 / the number of answer symbols (uniform guessing); None where answers are multi-token
    motifs of varying length (fuzzy recall: per-token chance depends on the motif mix)."""
    count = TASKS[name][1]
    if count is None:
        return None
    symbols = count(vocab, params)
    if symbols < 2:
        raise ValueError(
            f"task {name} with vocab {vocab} and {params or 'default settings'} has "
            f"{max(symbols, 0)} answer symbol(s): chance would be 1.0 and nothing is tested; "
            "raise its vocab (or lower its noise_vocab)"
        )
    return 1.0 / symbols


__all__ = ["TASKS", "STATE_TASKS", "Examples", "chance", "generate"]
