"""Every benchmark suite at toy sizes (tests and a quick smoke run, a few seconds per record).

python -m gpn_jax.bench --config=experiments/bench/bench_tiny.py --workdir=runs/bench_tiny
"""

import ml_collections

from gpn_jax.benchmarks import bench_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    c = bench_config.base_config("bench_tiny", "train,scaling,generate")
    small = dict(vocab_size=256, loss_chunk=16)
    m = c.models
    m.gpn_m.update(small | dict(d_model=32, d_emb=16, d_ffn=48, n_heads=2, d_key=8, d_value=8))
    m.gpn_m_autodiff.update(
        small | dict(d_model=32, d_emb=16, d_ffn=48, n_heads=2, d_key=8, d_value=8)
    )
    m.gpn.update(small | dict(d_model=32, d_emb=16, d_ffn=64))
    m.transformer.update(small | dict(d_model=32, n_layers=2, n_heads=2, d_ffn=48, max_seq_len=32))
    m.gdn.update(
        small | dict(d_model=32, n_layers=2, n_heads=2, d_key=8, d_value=8, d_ffn=48, chunk_size=8)
    )
    c.peak.update(dict(size=256, reps=2, bandwidth_mib=16))  # toy sizes: seconds, not minutes
    c.train.update(dict(batch_size=2, seq_len=32, warmup=1, steps=2))
    c.scaling.update(dict(seq_lens=(16, 64), batch_size=2, batch_sizes=(1, 2), seq_len=16, steps=2))
    c.generate.update(
        dict(contexts=(16, 64), batch_sizes=(1, 4), steps=3, rounds=2, warmup=1, feed_window=16)
    )
    return c
