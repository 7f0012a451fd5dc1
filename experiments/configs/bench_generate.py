"""Per-token decoding latency of GPN+M vs Transformer++ at 1k / 8k / 32k context, batch 1 and 32 (suite: generate); models and sizes in `bench_common`.

python -m gpn_jax.bench --config=experiments/configs/bench_generate.py --workdir=runs/bench --out=runs/bench/generate.json
"""

import ml_collections

from gpn_jax.configs import bench_common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    return bench_common.base_config("bench_generate", "generate")
