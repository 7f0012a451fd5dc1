"""The main job: a small GPN+M trained on the embedded corpus in a few minutes on 2 CPU cores.

    python -m gpn_jax.train --config=experiments/configs/demo.py --workdir=runs/demo

or from Python, with only the package installed:

    from gpn_jax.configs import demo
    from gpn_jax.training.loop import train_and_evaluate
    final = train_and_evaluate(demo.get_config(), "runs/demo")

Data: the English documentation text every CPython ships (`pydoc_data`), no download, with a
SentencePiece vocabulary of 2048 trained on its training split. The model has 1,118,856
parameters; 400 steps of 16 x 128 tokens. The run ends by printing the held-out perplexity next to
that of a unigram model of the same tokens (both in `<workdir>/final_metrics.json`).
"""

import ml_collections

from gpn_jax.configs import recipe


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = recipe.base_config()
    c.model = ml_collections.ConfigDict(
        dict(
            family="gpn",
            vocab_size=2048,
            d_model=256,
            d_emb=128,
            d_ffn=512,
            n_heads=4,
            d_key=32,
            d_value=64,
            loss_chunk=64,
        )
    )
    c.train.update(
        dict(
            batch_size=16,
            seq_len=128,
            steps=400,
            warmup_steps=50,
            learning_rate=3e-3,
            log_every=10,
            eval_every=100,
            eval_batches=8,
            checkpoint_every=100,
            final_eval_batches=0,
        )
    )
    return recipe.apply_arg(c, arg)
