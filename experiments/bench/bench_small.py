"""Training step side by side at B=16, T=512 (suites: train, alternate): GPN+M (fused and autodiff), GPN, Transformer++, GDN, each in its own process; then GPN+M and Transformer++ alternated step by step in one process (their ratio, robust to a shared machine's drift). Models and sizes in `bench_config`.

python -m gpn_jax.bench --config=experiments/bench/bench_small.py --workdir=runs/bench --out=runs/bench/small.json
"""

import ml_collections

from gpn_jax.benchmarks import bench_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    return bench_config.base_config("bench_small", "train,alternate")
