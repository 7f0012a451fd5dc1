"""GPN+M, one predict layer, 130M parameters — the paper's main model.

Sizes are the paper's: d=2496, d_emb=768, d_ffn=6656, 15 heads x 128 x 256 (491,520 memory cells),
vocab 32,000: 129,151,902 parameters (`python -m gpn_jax.summary --config=<this file>`).
Paper result (FineWeb-Edu, 10k steps of 128 x 2048): held-out PPL 18.06; LAMBADA 0.146 / 33.45.

    python -m gpn_jax.train --config=experiments/configs/gpn_m_1l_130m.py --workdir=/tmp/gpn_m_1l \
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
            d_model=2496,
            d_emb=768,
            d_ffn=6656,
            n_heads=15,
            d_key=128,
            d_value=256,
            n_layers=1,
            compute_dtype="bfloat16",  # bf16 matmuls, float32 state and memory (paper recipe)
            remat_segment=64,  # full BPTT over 2048 tokens, activations recomputed per 64
        ),
    )
