"""Benchmarks: what `python -m gpn_jax.bench`, `gpn_jax.bench_prepare`, `gpn_jax.aot` and
`experiments/bench/accel_bench.py` run (the entry points only parse flags; the accelerator
campaign itself is in `experiments/bench/`).

* `orchestrate`: the bench suites' orchestration: specs, one worker process per record, report, JSON.
* `measure`: platform, compute dtype, the matmul peak measured on this machine, memory, timing.
* `train`: one record = one model's jitted training step (loss, grads, AdamW) timed.
* `generate`: per-token decoding latency at long contexts.
* `worker`: runs one record in a fresh process, so each record's peak host RSS is its own.
* `report`, `roofline`, `op_profile`: tables, the scaling analysis, the plot, roofline bounds.
* `traffic`: the memory's HBM bytes per token read off a compiled step's HLO, and the minimum.
* `aot/`: the ahead-of-time compile planner (CPU devices, a TPU slice, NVIDIA GPUs), the batch search.
* `prepare`: `gpn_jax.prepare` and the `bin:` loader (its own command, `python -m` it).
* `workdirs`: private default working directories; no planted symlink followed.
"""
