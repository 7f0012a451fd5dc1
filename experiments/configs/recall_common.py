"""Shared setup of the associative-recall comparison (`recall_gpn_m.py` vs `recall_gpn.py`).

Task (`gpn_jax.data.recall`): 4 key-value pairs (16 keys, 16 values) then 12 queries in a
32-token window (each key asked 3 times); 20,000 training examples, 512 held-out ones;
chance accuracy 1/16. Both models are trained on all positions (`targets=all`) by the normal trainer
(`data.source = 'recall:...'`, no tokenizer) with the same recipe (AdamW 1e-3, batch 32,
1500 steps = 960k tokens) and the same parameter budget (GPN+M 55,300, GPN 55,296).
"""

import ml_collections

from gpn_jax.configs import recipe

TASK = "recall:pairs=4,keys=16,values=16,examples=20000,heldout=512,seed=0,targets=all"
VOCAB = 3 + 16 + 16  # reserved ids + keys + values


def recall_config(memory: bool, arg: str | None = None) -> ml_collections.ConfigDict:
    """GPN+M (memory=True) or GPN with the same parameter count, on the recall task."""
    if arg not in (None, "", "cpu"):
        raise ValueError(f"unknown config variant {arg!r}; recall configs are CPU-sized already")
    c = recipe.base_config()
    model = dict(
        family="gpn",
        vocab_size=VOCAB,
        d_model=64,
        d_emb=32,
        d_ffn=128,
        n_heads=2,
        d_key=16,
        d_value=32,
        loss_chunk=32,
    )
    if not memory:  # the memory's write and read parameters go to the FFN (d_ffn 128 -> 216)
        model.update(memory=False, n_heads=0, d_key=0, d_value=0, d_ffn=216)
    c.model = recipe.model_block(model)
    c.data.source = TASK
    c.data.heldout_fraction = 0.05  # unused by recall data (it holds out `heldout` examples)
    c.train.update(
        dict(
            batch_size=32,
            seq_len=32,
            steps=1500,
            warmup_steps=50,
            learning_rate=1e-3,  # 3e-3 reached only 67% for GPN+M
            log_every=50,
            eval_every=500,
            eval_batches=4,
            checkpoint_every=500,
            keep_checkpoints=1,
            async_checkpoints=False,
        )
    )
    return c
