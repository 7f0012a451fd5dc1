"""Shared pieces of the benchmark configs (`python -m gpn_jax.bench --config=experiments/bench/bench_*.py`).

The models are matched at ~6.1M parameters (same vocabulary 8192, same tokens per step):

    gpn_m           GPN+M 1L: d=512, d_emb=256, d_ffn=1408, 4 heads x 64 x 128   6,104,328 params
    gpn_m_autodiff  the same model through the plain autodiff scan (the "before")
    gpn             GPN 1L (no memory): d=512, d_emb=256, d_ffn=2096               6,106,368
    transformer     Transformer++: d=256, 6 layers, 4 heads, d_ffn=528, tied      6,106,368
    gdn             Gated DeltaNet: d=256, 4 layers, 4 heads x 64 x 128, d_ffn=612  6,101,792

All decode the loss 32 positions at a time (`loss_chunk`: the (32 x B, V) logits of a chunk stay
small; against 64, GPN+M's step was no slower and its peak RSS lower, Transformer++ unchanged
within noise).
`compute_dtype="auto"`: float32 on CPU, bfloat16 on GPU / TPU (the MFU peak is measured in
the same dtype).
"""

import ml_collections

from gpn_jax.configs import recipe

VOCAB = 8192


def models() -> ml_collections.ConfigDict:
    gpn_m = dict(
        family="gpn",
        vocab_size=VOCAB,
        d_model=512,
        d_emb=256,
        d_ffn=1408,
        n_heads=4,
        d_key=64,
        d_value=128,
        loss_chunk=32,
        scan_impl="fused",
    )
    gpn = gpn_m | dict(memory=False, n_heads=0, d_key=0, d_value=0, d_ffn=2096)
    transformer = dict(
        family="transformer",
        vocab_size=VOCAB,
        d_model=256,
        n_layers=6,
        n_heads=4,
        d_ffn=528,
        max_seq_len=512,
        loss_chunk=32,
    )
    gdn = dict(
        family="gdn",
        vocab_size=VOCAB,
        d_model=256,
        n_layers=4,
        n_heads=4,
        d_key=64,
        d_value=128,
        d_ffn=612,
        loss_chunk=32,
    )
    blocks = dict(
        gpn_m=gpn_m,
        gpn_m_autodiff=gpn_m | dict(scan_impl="autodiff"),
        gpn=gpn,
        transformer=transformer,
        gdn=gdn,
    )
    return ml_collections.ConfigDict({k: recipe.model_block(m) for k, m in blocks.items()})


def base_config(name: str, suites: str) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.name = name
    c.suites = suites  # comma-separated: train, scaling, generate
    c.compute_dtype = "auto"  # float32 on CPU, bfloat16 on GPU / TPU
    c.models = models()
    # size 0: a 2048 square matmul on CPU, 8192 elsewhere; bandwidth_mib 0: the copy
    # bandwidth over 256 MiB on CPU, 2 GiB elsewhere (`measure.memory_bandwidth`)
    c.peak = ml_collections.ConfigDict(dict(size=0, reps=5, bandwidth_mib=0))

    # training throughput side by side: same batch and window for every model
    c.train = ml_collections.ConfigDict(
        dict(
            models="gpn_m,gpn_m_autodiff,gpn,transformer,gdn",
            batch_size=16,
            seq_len=512,
            warmup=1,
            steps=5,  # timed steps after compile + warm-up; the median is reported
        )
    )
    # step time and peak memory of one model vs window length and vs batch, remat off / on
    # (remat segment: the largest divisor of T not above sqrt(T))
    c.scaling = ml_collections.ConfigDict(
        dict(
            model="gpn_m",
            seq_lens=(256, 512, 1024, 2048, 4096),
            batch_size=8,  # batch of the T sweep
            batch_sizes=(4, 8, 16, 32),
            seq_len=512,  # window of the B sweep
            warmup=1,
            steps=3,
        )
    )
    # the train suite's ratio, robust to a shared machine's drift: these models in one process
    # at the train suite's batch and window, one step of each in turn per round (bench.py)
    c.alternate = ml_collections.ConfigDict(
        dict(models="gpn_m,transformer", reference="transformer", rounds=8, warmup=1)
    )
    # per-token decoding latency after long contexts
    c.generate = ml_collections.ConfigDict(
        dict(
            models="gpn_m,transformer",
            contexts=(1024, 8192, 32768),
            batch_sizes=(1, 32),
            steps=16,
            rounds=3,
            warmup=2,
            feed_window=1024,
            kv_cache_limit_gb=4.0,
        )
    )
    return c
