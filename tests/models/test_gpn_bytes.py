"""`GPN.bytes_per_token`: the roofline's byte accounting, checked term by term against counts
done by hand for a tiny GPN+M (the arithmetic is in the comments)."""

import dataclasses

from gpn_jax.models import accounting
from gpn_jax.models.gpn import GPN, GPNConfig

# vocab 16, d 4, e 2, f 6, 1 head of 2 x 3, one layer; batch 2, window 8, loss chunk 4
TINY = GPNConfig(
    vocab_size=16, d_model=4, d_emb=2, d_ffn=6, n_heads=1, d_key=2, d_value=3, loss_chunk=4,
    scan_impl="fused",
)  # fmt: skip


def test_bytes_per_token_by_hand():
    # write columns hk + hu + 2h = 2 + 3 + 2 = 7; layer columns 2f + d + hk + hu = 12 + 4 + 5 = 21
    # recurrent matrices: d (7 + 21) + (f + hu) d + d d = 112 + 36 + 16 = 164 elements
    # fused segment S: the largest divisor of T=8 up to max(32, sqrt 8) = 8; loss chunk C = 4
    got = accounting.bytes_per_token(GPN(TINY), 2, 8)
    assert got == {
        # 2 loop passes x 164 x 4 B / batch 2, + (2 reads x 4 B + 8 B grad) x (16*2 + 4*2) / (C*B)
        "weights": 2 * 164 * 4 / 2 + 16 * 40 / 8,  # 656 + 80
        "weight_grads": 8 * 164 / (8 * 2),  # float32 read + write once per segment
        # residual width s 4 + zk 2 + Z0 (7 + 21) + p 4 + zg 4 = 42, written and read; + p, dp,
        # xg, dxg (4 each) written and read: 4 B x (2 x 42 + 8 x 4)
        "activations": 4 * (2 * 42 + 8 * 4),
        # (H K U = 6) x (4 B x (5 + 2 L) passes + 8 B cotangent)
        "memory": 6 * (4 * 7 + 8),
        "logits": 5 * 4 * 16,
        "train": 736 + 82 + 464 + 216 + 320,
    }


def test_bytes_per_token_switches():
    bf16 = accounting.bytes_per_token(
        GPN(dataclasses.replace(TINY, compute_dtype="bfloat16")), 2, 8
    )
    assert bf16["weights"] == 2 * 164 * 2 / 2 + (2 * 2 + 8) * 40 / 8  # 2-byte weights
    autodiff = GPN(dataclasses.replace(TINY, scan_impl="autodiff"))
    assert accounting.bytes_per_token(autodiff, 2, 8)["weight_grads"] == 8 * 164 / 2  # every step
    remat = GPN(dataclasses.replace(TINY, remat_segment=4))
    got = accounting.bytes_per_token(remat, 2, 8)
    assert got["weights"] == 3 * 164 * 4 / 2 + 80 and got["weight_grads"] == 8 * 164 / (4 * 2)
    # bfloat16 memory storage: 2-byte passes, the float32 cotangent unchanged: saves 6 x 2 x 7 B
    bf16_mem = GPN(dataclasses.replace(TINY, memory_dtype="bfloat16"))
    assert accounting.bytes_per_token(bf16_mem, 2, 8)["memory"] == 6 * (2 * 7 + 8) == 216 - 84
    no_mem = dataclasses.replace(TINY, memory=False, n_heads=0, d_key=0, d_value=0)
    assert accounting.bytes_per_token(GPN(no_mem), 2, 8)["memory"] == 0
