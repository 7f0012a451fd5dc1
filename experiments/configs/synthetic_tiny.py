"""The synthetic suite, tiny: every task at toy size, two families, for the tests (seconds of
training; the numbers mean nothing)."""

from experiments.configs import synthetic_small as small


def get_config(arg: str | None = None):
    if arg not in (None, ""):
        raise ValueError(f"unknown config variant {arg!r}; synthetic_tiny has none")
    c = small.get_config()
    c.name = "synthetic_tiny"
    c.families = "gpn_m,transformer"
    t = small.task
    c.tasks = dict(
        in_context_recall=t(16, 8, 64),
        fuzzy_recall=t(16, 9, 64, k_motif=2, v_motif=2),
        noisy_recall=t(16, 12, 64, frac_noise=0.2, noise_vocab=4),
        selective_copying=t(16, 8, 64, n_copy=4),
        compression=t(8, 8, 64),
        memorisation=t(16, 16, 32),
        mqar=t(16, 17, 64, pairs=4),
        parity=t(8, 2, 64, test_lens=(8, 24)),
        modular_addition=t(8, 5, 64, test_lens=(8, 24)),
        s5=t(8, 120, 64, test_lens=(8, 24)),
    )
    c.width = 8
    c.heads = 2
    c.learning_rates = (1e-3, 1e-2)
    c.seeds = (0, 1)
    c.steps = 3
    c.batch_size = 4
    c.n_valid = 8
    c.n_test = 8
    c.eval_batch = 8
    c.log_every = 3
    c.eval_every = 2
    return c
