"""Tiny models of three families for the streaming-eval tests."""

import jax

from gpn_jax.models import factory
from tests.tolerance import f32_bound

V = 64
GPN_M = dict(family="gpn", vocab_size=V, d_model=32, d_emb=16, d_ffn=64, n_heads=2, d_key=8,
             d_value=8, loss_chunk=16)  # fmt: skip
TF = dict(family="transformer", vocab_size=V, d_model=32, n_layers=1, n_heads=2, d_ffn=64,
          max_seq_len=32, loss_chunk=16)  # fmt: skip
GDN = dict(family="gdn", vocab_size=V, d_model=32, n_layers=1, n_heads=2, d_key=8, d_value=8,
           d_ffn=64, chunk_size=16, loss_chunk=16)  # fmt: skip


def build(cfg, seed=0):
    """(model, parameters initialised from `seed`) for a model config dict."""
    model = factory.build_model(cfg)
    return model, model.init(jax.random.PRNGKey(seed))


def ce_bound(positions: int) -> float:
    """Float32 bound (tests/tolerance.py) for these models' per-token CE computed by two programs:
    a CE follows up to `positions` steps of reductions no longer than d_ffn = 64, then the
    V-way logsumexp; margin 1, the chain's length being the worst case already."""
    return f32_bound(positions * 64 + V, 1)
