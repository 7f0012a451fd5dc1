"""The paper's four-model comparison at 130M parameters (Table 1 setting), for real hardware.

    python -m experiments.compare --config=experiments/configs/compare_130m.py --workdir=DIR \
        --config.data.source=bin:/data/fineweb_edu \
        [--lambada_path=lambada_openai_test.jsonl]

`/data/fineweb_edu` is FineWeb-Edu tokenized with LLaMA-2's tokenizer by `gpn-prepare` (it holds
the tokenizer and the held-out shards): README.md, "Preparing a corpus".

Models: the model blocks of `gpn_m_1l_130m.py` (129,151,902 parameters), `gpn_1l_130m.py`
(129,234,848), `transformer_130m.py` (128,994,048) and `gdn_130m.py` (129,503,608), unchanged.
Shared budget: the paper's recipe from `recipe.base_config` — 10,000 steps of 128 x 2048 tokens
(2.6B tokens per model), AdamW 6e-4, 100 warm-up steps, cosine to 10 %, wd 0.1, clip 1.0.
All four use vocab 32,000, so give a 32k tokenizer (the paper: LLaMA-2's) and a large corpus;
the embedded default corpus is far too small for it. Add `--config.train.grad_accum=N` where
128 x 2048 does not fit in memory (the optimiser step, and so the budget, is unchanged).
"""

import ml_collections

from experiments.configs import (
    compare_common,
    gdn_130m,
    gpn_1l_130m,
    gpn_m_1l_130m,
    transformer_130m,
)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    c = compare_common.compare_config(
        dict(
            gpn_m=gpn_m_1l_130m.get_config().model,
            gpn=gpn_1l_130m.get_config().model,
            transformer=transformer_130m.get_config().model,
            gdn=gdn_130m.get_config().model,
        )
    )
    c.compare.labels.gpn_m = "GPN+M (1L)"
    c.compare.labels.gpn = "GPN (1L)"
    return c
