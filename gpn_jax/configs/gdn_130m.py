"""Gated DeltaNet baseline, 130M parameters — the paper's linear-recurrence baseline at the GPN+M 1L scale.

Sizes: vocab 32,000, d=768, 10 layers (as in the paper), 6 heads with q/k width 128 and v width
256 (FLA's expand_v = 2; 196,608 state cells per layer), short convolution 4, SwiGLU
d_ffn=2496, tied embeddings, no biases: 129,503,608 parameters (GPN+M 1L: 129,151,902, i.e.
+0.27 %; `python -m gpn_jax.summary --config=<this file>`). Heads/widths/d_ffn are our choice
(the paper fixes only d and the depth); d_ffn sets the count. Training uses the chunked delta
rule (chunk 64); decoding the recurrent form. Forward FLOPs per token at T=2048:
275.9M; training 827.8M (matmuls incl. the chunked delta rule).

    python -m gpn_jax.train --config=experiments/configs/gdn_130m.py --workdir=/tmp/gdn \
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
            family="gdn",
            vocab_size=32_000,
            d_model=768,
            n_layers=10,
            n_heads=6,
            d_key=128,
            d_value=256,
            d_ffn=2496,
            compute_dtype="bfloat16",  # bf16 matmuls; residual, norms, conv, delta rule float32
            remat=True,  # recompute each block in the backward pass (math unchanged)
        ),
    )
