"""Data pipeline: text / tfds / pre-tokenised sources -> tokenizer -> resumable windows (Grain).

Import the modules (`pipeline.from_config`, `tokenizer`, `windows`, ...): the package itself
loads nothing, so `prepare`'s tokenizing workers, which import `gpn_jax.data.tokenizer`, do not
import JAX and Grain first.
"""
