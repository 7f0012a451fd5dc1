"""Training step side by side at B=16, T=512 (suite: train): GPN+M (fused and autodiff), GPN, Transformer++, GDN; models and sizes in `bench_common`.

python -m gpn_jax.bench --config=experiments/configs/bench_small.py --workdir=/tmp/gpn_bench --out=/tmp/gpn_bench/small.json
"""

import ml_collections

from gpn_jax.configs import bench_common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    return bench_common.base_config("bench_small", "train")
