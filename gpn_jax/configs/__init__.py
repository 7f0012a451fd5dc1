"""The shared recipe experiments build on (ml_collections).

* `blocks`: the train, data, logging and mesh fields, each declared once (type, default,
  bounds, `:cpu` value, one-line doc); `complete` fills what an older saved config lacks.
* `recipe`: the training config every experiment starts from (`base_config`: the paper's
  recipe, the data and mesh blocks), the `model_block` completion and the `:arg` variants
  (`apply_arg`: `--config=path.py:cpu` shrinks any config for a CPU run).
* `bench_config`: the benchmark config `gpn_jax.bench` reads (matched models, suites).
* `demo`: the main job's config (the README's quickstart, `experiments/configs/demo.py`).
* `gpn_m_1l_130m`, `gpn_1l_130m`, `gpn_m_2l_130m`, `transformer_130m`, `gdn_130m`: the paper's
  130M family and its baselines.

Every module here with a `get_config` is a named config: the CLIs take `--config=NAME[:arg]`
(e.g. `--config=gpn_m_1l_130m:cpu`) for it, so an installed package needs no checkout
(`gpn_jax.io.config_args.resolve`). The other experiment configs live in
`experiments/configs/*.py` (those of the named ones import them from here); nothing in
`gpn_jax` imports `experiments`.
"""
