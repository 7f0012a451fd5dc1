"""`bytes_per_token` of Transformer++ and Gated DeltaNet (`accounting.layer_parallel_bytes`):
term by term against counts done by hand for tiny models (the arithmetic is in the comments),
so the bench's roofline covers every family it trains."""

import dataclasses

from gpn_jax.models import accounting
from gpn_jax.models.gdn import GatedDeltaNet, GDNConfig
from gpn_jax.models.transformer import Transformer, TransformerConfig

# vocab 16, d 4, f 6, one layer; batch 2, window 8, loss chunk 4
T_PP = TransformerConfig(
    vocab_size=16, d_model=4, n_layers=1, n_heads=2, d_ffn=6, max_seq_len=8, loss_chunk=4
)
GDN = GDNConfig(
    vocab_size=16, d_model=4, n_layers=1, n_heads=1, d_key=2, d_value=3, d_ffn=6, chunk_size=4,
    loss_chunk=4,
)  # fmt: skip


def test_transformer_bytes_per_token_by_hand():
    # layer matrices 4 d^2 + 3 d f = 64 + 72 = 136; head V d = 64; B T = 16 tokens per step
    got = accounting.bytes_per_token(Transformer(T_PP), 2, 8)
    assert got == {
        # 2 passes x 136 x 4 B / 16 tokens, + (2 reads x 4 B + 8 B grad) x 64 / (C 4 x B 2)
        "weights": 2 * 136 * 4 / 16 + 16 * 64 / 8,  # 68 + 128
        "weight_grads": 8 * 136 / 16,  # 68
        "activations": 4 * 4 * (10 * 4 + 3 * 6),  # residuals 58 and cotangents, 4 B, w + r
        "mixer": 10 * 4 * 2 * 8,  # 2 heads x T 8 scores, 10 passes of 4 B
        "logits": 5 * 4 * 16,
        "train": 196 + 68 + 928 + 640 + 320,
    }


def test_gated_deltanet_bytes_per_token_by_hand():
    # H K = 2, H U = 3, H = 1: matrices d (2*2 + 2*3 + 2) + 3 d + 3 d f = 48 + 12 + 72 = 132
    got = accounting.bytes_per_token(GatedDeltaNet(GDN), 2, 8)
    # residuals 4 d + 6 HK + 5 HU + 2 H + 3 f = 16 + 12 + 15 + 2 + 18 = 63
    # chunk C = 4: state H K U = 6 -> 5 x 4 B x 6 / 4 = 30; (C, C) matrices 3 x 6 x 4 B x 1 x 4 = 288
    assert got == {
        "weights": 2 * 132 * 4 / 16 + 16 * 64 / 8,  # 66 + 128
        "weight_grads": 8 * 132 / 16,  # 66
        "activations": 4 * 4 * 63,
        "mixer": 30 + 288,
        "logits": 5 * 4 * 16,
        "train": 194 + 66 + 1008 + 318 + 320,
    }


def test_switches():
    remat = accounting.bytes_per_token(Transformer(dataclasses.replace(T_PP, remat=True)), 2, 8)
    assert remat["weights"] == 3 * 136 * 4 / 16 + 128  # the forward runs twice
    bf16 = Transformer(dataclasses.replace(T_PP, compute_dtype="bfloat16"))
    assert accounting.bytes_per_token(bf16, 2, 8)["weights"] == 2 * 136 * 2 / 16 + 12 * 64 / 8
    # the scores grow with the window; the weights' share shrinks with more tokens per step
    long = accounting.bytes_per_token(Transformer(T_PP), 4, 16)
    assert long["mixer"] == 10 * 4 * 2 * 16 and long["weight_grads"] == 8 * 136 / 64
    recurrent = GatedDeltaNet(dataclasses.replace(GDN, chunk_size=0))
    assert accounting.bytes_per_token(recurrent, 2, 8)["mixer"] == 6 * 4 * 6
    one_chunk = accounting.bytes_per_token(GatedDeltaNet(GDN), 2, 2)  # C = min(4, T 2) = 2
    assert one_chunk["mixer"] == 5 * 4 * 6 / 2 + 3 * 6 * 4 * 2
