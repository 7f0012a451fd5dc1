"""MQAR sweep (`python -m experiments.recall_sweep`): GPN+M, GPN, Gated DeltaNet and
Transformer++ at matched parameter counts on multi-query associative recall, by the standard
protocol (Zoology; the Gated DeltaNet paper's synthetic): loss on the answers only, fresh
examples every step, a small learning-rate sweep with the best rate kept per cell, >= 2 seeds.

    python -m experiments.recall_sweep --config=experiments/configs/recall_sweep.py \\
        --workdir=/tmp/mqar                      # the CPU grid (~236K-parameter models)
    python -m experiments.recall_sweep --config=experiments/configs/recall_sweep.py:tiny \\
        --workdir=/tmp/mqar_tiny                 # a smoke grid (tests)

Cells: every (pairs, seq_len, width) of the grid below; keys = values = `n_keys` ids. Widths
set GPN+M's d_model (d_emb d/2, d_ffn `ffn_mult` d, 2 heads of d_key d/4, d_value d/2); the other
families get GPN+M's parameter count by their d_ffn (`experiments.recall_sweep.match_ffn`).
"""

import ml_collections

FAMILIES = "gpn_m,gpn,gdn,transformer"


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.families = FAMILIES
    c.pairs = (8, 4)  # the headline cell (8 pairs / 32 keys / T = 32) runs first
    c.seq_lens = (32,)
    c.widths = (128,)  # GPN+M: 237,572 parameters at width 128 (vocab 67)
    c.ffn_mult = 2.375  # GPN+M's d_ffn / width (2.375 x 128 = 304)
    c.n_keys = 32  # key ids = value ids
    c.learning_rates = (3e-3, 1e-3)
    c.seeds = (0, 1)
    c.steps = 1500
    c.batch_size = 32
    c.warmup_steps = 50
    c.heldout = 512  # held-out examples per cell (fresh, independently seeded)
    c.gdn_layers = 2
    c.transformer_layers = 2
    c.report_only = False  # True: tabulate finished runs, train nothing
    if arg == "tiny":
        c.update(dict(families="gpn_m,gdn", pairs=(2,), seq_lens=(8,), widths=(16,), n_keys=4,
                      learning_rates=(3e-3,), seeds=(0, 1), steps=3, batch_size=8,
                      warmup_steps=1, heldout=16, gdn_layers=1, transformer_layers=1))  # fmt: skip
    elif arg not in (None, ""):
        raise ValueError(f"unknown config variant {arg!r}; the only variant is ':tiny'")
    return c
