"""Transformer++ baseline, 130M parameters — the paper's attention baseline at the GPN+M 1L scale.

Sizes: vocab 32,000, d=768, 12 layers (as in the paper), 12 heads x 64, SwiGLU d_ffn=2752,
tied embeddings, RoPE, no biases: 128,994,048 parameters (GPN+M 1L: 129,151,902, i.e. -0.12 %;
`python -m gpn_jax.summary --config=<this file>`). Forward FLOPs per token at T=2048
(attention counted at the causal average context T/2): 295.7M; training 887.1M.

    python -m gpn_jax.train --config=experiments/configs/transformer_130m.py --workdir=/tmp/tpp \
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
            family="transformer",
            vocab_size=32_000,
            d_model=768,
            n_layers=12,
            n_heads=12,
            d_ffn=2752,
            max_seq_len=2048,
            compute_dtype="bfloat16",  # bf16 matmuls + fused (cuDNN) attention; float32 residual
            remat=True,  # recompute each block in the backward pass (math unchanged)
        ),
    )
