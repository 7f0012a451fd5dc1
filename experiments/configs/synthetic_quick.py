"""The synthetic suite, quick: a first table in minutes (`python -m experiments.synthetic
--config=experiments/configs/synthetic_quick.py --workdir=DIR`).

The small suite's protocol (`synthetic_small.py`) scaled down further, each change for the
budget (a first table in <= 20 minutes on 2 CPU cores): a 64-token window (MAD's recall
tasks at 64 tokens instead of 128, selective copying at 64 with 8 tokens to copy, MQAR with 16
keys, memorisation over a 64-token vocabulary), state tracking trained at length 16 and
tested at 16-128, width 32 (about 16K parameters), 100 steps at batch 16. At this budget most
cells stay near chance: the table shows the harness end to end, not the families' ranking.
"""

from experiments.configs import synthetic_small as small

MQAR_WHY = " (16 keys + 16 values; each key queried 3 times, where Zoology queries each once)"


def get_config(arg: str | None = None):
    if arg not in (None, ""):
        raise ValueError(f"unknown config variant {arg!r}; synthetic_quick has none")
    c = small.get_config()
    c.name = "synthetic_quick"
    why = "quick: scaled to a 64-token window for the 20-minute budget"
    state_why = "quick: trained at length 16, tested at 16-128, for the 20-minute budget"
    c.tasks = dict(
        in_context_recall=small.task(64, 16, 12_800, why),
        fuzzy_recall=small.task(64, 16, 12_800, why, k_motif=3, v_motif=3),
        noisy_recall=small.task(64, 32, 12_800, why, frac_noise=0.2, noise_vocab=16),
        selective_copying=small.task(64, 16, 12_800, why, n_copy=8),
        compression=small.task(32, 16, 12_800, small.small_tasks().compression.why),
        memorisation=small.task(32, 64, 256, why + " (vocab 64, not 256)"),
        mqar=small.task(64, 33, 20_000, why + MQAR_WHY, pairs=8, repeat_queries=True),
        parity=small.task(16, 2, 12_800, state_why, test_lens=(16, 32, 64, 128)),
        modular_addition=small.task(16, 5, 12_800, state_why, test_lens=(16, 32, 64, 128)),
        s5=small.task(16, 120, 12_800, state_why, test_lens=(16, 32, 64, 128)),
    )
    c.window = 64
    c.width = 32
    c.steps = 100
    c.batch_size = 16
    c.n_valid = 128
    c.n_test = 256
    c.log_every = 50
    return c
