"""MQAR sweep (`python -m experiments.recall_sweep`): GPN+M, GPN, Gated DeltaNet and
Transformer++ at matched parameter counts on multi-query associative recall, by the standard
protocol (Zoology; the Gated DeltaNet paper's synthetic): loss on the answers only, fresh
examples every step, a learning-rate sweep (3e-3, 1e-3, 5e-4, 3e-4 — Zoology sweeps down to
1e-4) with the best rate kept per cell, >= 2 seeds.

    python -m experiments.recall_sweep --config=experiments/configs/recall_sweep.py \\
        --workdir=/tmp/mqar                      # the CPU grid (~236K-parameter models)
    python -m experiments.recall_sweep --config=experiments/configs/recall_sweep.py:tiny \\
        --workdir=/tmp/mqar_tiny                 # a smoke grid (tests)

Runs train side by side, one single-core process per CPU core (`workers = 0`; `workers = 1`
trains them one after the other in the calling process, on every core).

Cells: every (pairs, seq_len, width) of the grid below; keys = values = `n_keys` ids. Widths
set GPN+M's d_model (d_emb d/2, d_ffn `ffn_mult` d, `heads` memory heads of d_key d/(2 heads),
d_value d/heads: H x dk and H x dv do not depend on `heads`, so the count moves only by the
per-head gate rows); the other families get GPN+M's parameter count by their d_ffn (`gpn_jax.models.factory.matched`);
Gated DeltaNet keeps 2 heads of d/4 x d/2 per layer.

Why 4 heads and lrs below 1e-3 (measured at 8 pairs / T = 32 / width 128, seed 0, 1,500 steps): each
head's decay rate is drawn at init (A ~ U(0, 16), dt log-uniform in [1e-3, 1e-1], as the paper), and with
2 heads seed 0 draws no head whose initial 1/e memory lag (1 / (A softplus(dt_bias))) covers the
pair-to-query distances of a T = 32 window (up to 30 tokens): lags 7.4 and 1.1 (seed 1: 14.7).
Seed 0 reached 0.151 (2 heads, lr 1e-3), 0.774 (2 heads, 3e-4), 0.533 (4 heads, 1e-3),
0.971 (4 heads, 5e-4) and 0.951 (4 heads, 3e-4).
"""

import ml_collections

FAMILIES = "gpn_m,gpn,gdn,transformer"


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.families = FAMILIES
    c.pairs = (8, 4)  # the headline cell (8 pairs / 32 keys / T = 32) runs first
    c.seq_lens = (32,)
    c.widths = (128,)  # GPN+M: 238,088 parameters at width 128 (vocab 67)
    c.heads = 4  # GPN+M's memory heads: d_key width / (2 heads), d_value width / heads
    c.ffn_mult = 2.375  # GPN+M's d_ffn / width (2.375 x 128 = 304)
    c.n_keys = 32  # key ids = value ids
    c.learning_rates = (3e-3, 1e-3, 5e-4, 3e-4)
    c.seeds = (0, 1)
    c.steps = 1500
    c.batch_size = 32
    c.warmup_steps = 50
    c.heldout = 512  # held-out examples per cell (fresh, independently seeded)
    c.gdn_layers = 2
    c.transformer_layers = 2
    c.report_only = False  # True: tabulate finished runs, train nothing
    c.workers = 0  # runs side by side; 0: one single-core process per CPU core (1 on a GPU/TPU)
    if arg == "tiny":
        c.update(dict(families="gpn_m,gdn", pairs=(2,), seq_lens=(8,), widths=(16,), n_keys=4,
                      learning_rates=(3e-3,), seeds=(0, 1), steps=3, batch_size=8,
                      warmup_steps=1, heldout=16, gdn_layers=1, transformer_layers=1))  # fmt: skip
    elif arg not in (None, ""):
        raise ValueError(f"unknown config variant {arg!r}; the only variant is ':tiny'")
    return c
