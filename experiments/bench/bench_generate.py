"""Per-token decoding latency of GPN+M vs Transformer++ at 1k / 8k / 32k context, batch 1 and 32 (suite: generate); models and sizes in `bench_config`.

python -m gpn_jax.bench --config=experiments/bench/bench_generate.py --workdir=runs/bench --out=runs/bench/generate.json
"""

import ml_collections

from gpn_jax.benchmarks import bench_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    return bench_config.base_config("bench_generate", "generate")
