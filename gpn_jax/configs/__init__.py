"""The shared recipe experiments build on (ml_collections).

* `recipe`: the training config every experiment starts from (`base_config`: the paper's
  recipe, the data and mesh blocks), the `model_block` completion and the `:arg` variants
  (`apply_arg`: `--config=path.py:cpu` shrinks any config for a CPU run).
* `bench_config`: the benchmark config `gpn_jax.bench` reads (matched models, suites).
* `demo`: the main job's config (the README's quickstart, `experiments/configs/demo.py`).

Experiment configs live in `experiments/configs/*.py` and import from here; nothing in
`gpn_jax` imports `experiments`.
"""
