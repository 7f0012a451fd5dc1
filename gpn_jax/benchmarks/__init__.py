"""Benchmarks behind `python -m gpn_jax.bench`: training throughput and MFU, scaling, generation.

* `common`: platform, compute dtype, the matmul peak measured on this machine, memory, timing.
* `train`: one record = one model's jitted training step (loss, grads, AdamW) timed.
* `generate`: per-token decoding latency at long contexts.
* `worker`: runs one record in a fresh process, so each record's peak host RSS is its own.
* `report`: tables, the scaling analysis and the PNG plot.
* `prepare`: `gpn_jax.prepare` and the `bin:` loader (its own command, `python -m` it).
"""
