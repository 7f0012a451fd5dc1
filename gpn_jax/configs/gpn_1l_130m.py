"""GPN (no memory), one predict layer, 130M parameters, as in the paper.

Paper: d=3184. The paper does not state d_emb or d_ffn; we keep d_emb=768 (as GPN+M) and choose
d_ffn=8320 so the model lands at 129,234,848 parameters (-0.6 % of 130M;
`python -m gpn_jax.summary --config=<this file>`). Paper result: held-out PPL 23.51; LAMBADA
0.015 / 263.6 — without the matrix memory the single state cannot hold the context.

    python -m gpn_jax.train --config=experiments/configs/gpn_1l_130m.py --workdir=/tmp/gpn_1l \
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
            d_model=3184,
            d_emb=768,
            d_ffn=8320,
            n_layers=1,
            memory=False,
            compute_dtype="bfloat16",
            remat_segment=64,
        ),
    )
