"""The accelerator figure of the README (issue #16, item 4): the paper's 130M GPN+M training step
(`gpn_m_1l_130m.py`'s model, T = 2048, its remat segment of 64) in bfloat16 on a GPU / TPU, at
the largest batch of `train.batch_sizes` that fits (`experiments/accel_bench.py` tries them
largest first). `:tiny` is a toy version of the same run for CPU tests.

python experiments/accel_bench.py --config=experiments/configs/bench_accel.py \
    --workdir=runs/accel --device_spec=h100,h200

Candidate batches from `python -m gpn_jax.aot --config=experiments/configs/gpn_m_1l_130m.py
--devices=1 --mesh=data=1,fsdp=1,tensor=1 --config.train.seq_len=2048
--config.train.batch_size=B` (XLA:CPU's memory analysis, an estimate of the accelerator's):
about 39 GiB at B = 128, 75 at 256, 111 at 384 per device.
"""

import ml_collections

from experiments.configs import bench_tiny, gpn_m_1l_130m
from gpn_jax.configs import bench_common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, "", "tiny"):
        raise ValueError(f"unknown config variant {arg!r}; the only variant is ':tiny'")
    c = bench_common.base_config("bench_accel", "train")  # compute_dtype auto: bf16 on GPU/TPU
    c.models = ml_collections.ConfigDict({"gpn_m_130m": gpn_m_1l_130m.get_config().model})
    c.train.update(dict(models="gpn_m_130m", seq_len=2048, warmup=1, steps=3))
    c.train.batch_sizes = (384, 256, 128)  # tried largest first; batch_size: the one being run
    c.train.batch_size = c.train.batch_sizes[0]
    if arg == "tiny":
        tiny = bench_tiny.get_config()  # its toy GPN+M and matmul-peak sizes
        c.models = ml_collections.ConfigDict({"gpn_m_130m": tiny.models.gpn_m})
        c.peak = tiny.peak
        c.train.update(dict(seq_len=32, warmup=1, steps=1, batch_sizes=(4, 2), batch_size=4))
    return c
