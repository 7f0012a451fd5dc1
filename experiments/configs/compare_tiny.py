"""The four-model comparison at CPU scale: GPN+M, GPN, Transformer++ and Gated DeltaNet.

    python -m experiments.compare --config=experiments/configs/compare_tiny.py --workdir=/tmp/cmp

One shared budget (300 steps of 16 x 128 tokens = 614,400 tokens per model, ~5 epochs of the
embedded corpus's training split; the paper's AdamW / cosine recipe at a CPU learning rate) on
the embedded corpus with one SentencePiece tokenizer (vocab 2048) trained once into the workdir.
GPN+M is `demo.py`'s model block, unchanged. Sizes put the four within 4 % of each other:
GPN+M 1,118,856 / GPN 1,134,592 / Transformer++ 1,090,688 / Gated DeltaNet 1,097,104
parameters. About 5 minutes on 2 idle CPU cores (GDN's steps cost about twice GPN+M's and
three times the Transformer's).
"""

import ml_collections

from experiments.configs import compare_common, demo

VOCAB = 2048


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    gpn_m = demo.get_config().model
    gpn = dict(
        family="gpn",
        vocab_size=VOCAB,
        d_model=320,
        d_emb=128,
        d_ffn=608,
        memory=False,
        loss_chunk=64,
    )
    transformer = dict(
        family="transformer",
        vocab_size=VOCAB,
        d_model=128,
        n_layers=4,
        n_heads=4,
        d_ffn=368,
        max_seq_len=128,  # follows train.seq_len (set by the compare)
        loss_chunk=64,
    )
    gdn = dict(
        family="gdn",
        vocab_size=VOCAB,
        d_model=128,
        n_layers=4,
        n_heads=2,
        d_key=32,
        d_value=64,
        d_ffn=368,
        chunk_size=32,
        loss_chunk=64,
    )
    c = compare_common.compare_config(dict(gpn_m=gpn_m, gpn=gpn, transformer=transformer, gdn=gdn))
    c.train.update(
        dict(
            batch_size=16,
            seq_len=128,
            steps=300,
            warmup_steps=30,
            learning_rate=3e-3,
            log_every=10,
            eval_every=100,
            eval_batches=4,
            checkpoint_every=100,
            final_eval_batches=0,
        )
    )
    return c
