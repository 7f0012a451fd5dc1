"""GPN+M step time and peak memory vs T (256 -> 4096) and vs B, remat off / on (suite: scaling); models and sizes in `bench_config`.

python -m gpn_jax.bench --config=experiments/bench/bench_scaling.py --workdir=runs/bench --out=runs/bench/scaling.json
"""

import ml_collections

from gpn_jax.benchmarks import bench_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    return bench_config.base_config("bench_scaling", "scaling")
