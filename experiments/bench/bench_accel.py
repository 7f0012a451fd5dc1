"""The prepared accelerator run (`experiments/bench/accel_bench.py`): the paper's 130M GPN+M training
step (`gpn_m_1l_130m.py`'s model, T = 2048, its remat segment of 64) in bfloat16 on a GPU / TPU
at batch 128. `:tiny` is a toy version of the same run for CPU tests.

    python experiments/bench/accel_bench.py --out=runs/accel

XLA:CPU's memory analysis of this step (`python -m gpn_jax.aot --devices=1 --mesh=1,1,1`) gives
about 39 GiB per device at B = 128, which an 80 GB+ GPU holds.
"""

import ml_collections

from experiments.bench import bench_tiny
from experiments.configs import gpn_m_1l_130m
from gpn_jax.benchmarks import bench_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, "", "tiny"):
        raise ValueError(f"unknown config variant {arg!r}; the only variant is ':tiny'")
    c = bench_config.base_config("bench_accel", "train")  # compute_dtype auto: bf16 on GPU/TPU
    c.models = ml_collections.ConfigDict({"gpn_m_130m": gpn_m_1l_130m.get_config().model})
    c.train.update(dict(models="gpn_m_130m", seq_len=2048, warmup=1, steps=3))
    c.train.batch_size = 128
    if arg == "tiny":
        tiny = bench_tiny.get_config()  # its toy GPN+M and matmul-peak sizes
        c.models = ml_collections.ConfigDict({"gpn_m_130m": tiny.models.gpn_m})
        c.peak = tiny.peak
        c.train.update(dict(seq_len=32, warmup=1, steps=1, batch_size=4))
    return c
