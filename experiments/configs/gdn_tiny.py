"""A tiny Gated DeltaNet for CPU tests and quick experiments (vocab 512, d=64, 2 layers, 2 heads x 16 x 32)."""

import ml_collections

from experiments.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = common.base_config()
    c.model = ml_collections.ConfigDict(
        dict(
            family="gdn",
            vocab_size=512,
            d_model=64,
            n_layers=2,
            n_heads=2,
            d_key=16,
            d_value=32,
            d_ffn=128,
            conv_size=4,
            tie_embeddings=True,
            bos_id=1,
            compute_dtype="float32",
            chunk_size=16,
            loss_chunk=32,
            remat=False,
        )
    )
    c.train.update(
        dict(
            batch_size=4,
            seq_len=32,
            steps=20,
            warmup_steps=5,
            learning_rate=3e-3,
            log_every=5,
            eval_every=10,
            eval_batches=2,
            checkpoint_every=10,
        )
    )
    return common.apply_arg(c, arg)
