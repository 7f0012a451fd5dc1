"""GPN+M, two predict layers, 130M parameters (the paper's two-layer GPN+M).

Paper: d=1920, d_emb=768, 11 heads x 128 x 256 (360,448 memory cells). The paper does not state
d_ffn; we choose d_ffn=4800 so the model lands at 129,099,926 parameters (-0.7 % of 130M;
`python -m gpn_jax.summary --config=<this file>`). Truncated BPTT at 512 tokens as in the paper:
windows of 512 with the carry passed between consecutive windows of the same sequences is the
`seq_len=512` setting here. Paper result: held-out PPL 16.95; LAMBADA 0.160 / 27.39.

    python -m gpn_jax.train --config=experiments/configs/gpn_m_2l_130m.py --workdir=/tmp/gpn_m_2l \
        --config.data.source=bin:/data/fineweb_edu

`/data/fineweb_edu` is FineWeb-Edu tokenized with LLaMA-2's tokenizer by `gpn-prepare` (it holds
the tokenizer and the held-out shards): README.md, "Preparing a corpus".
"""

import ml_collections

from gpn_jax.configs import recipe


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return recipe.with_model(
        arg,
        dict(
            family="gpn",
            vocab_size=32_000,
            d_model=1920,
            d_emb=768,
            d_ffn=4800,
            n_heads=11,
            d_key=128,
            d_value=256,
            n_layers=2,
            compute_dtype="bfloat16",
            remat_segment=64,
        ),
        seq_len=512,  # truncated BPTT at 512
        batch_size=512,  # same tokens per step as 128 x 2048
    )
