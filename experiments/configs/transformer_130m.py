"""Transformer++ baseline, 130M parameters — the paper's attention baseline at the GPN+M 1L scale.

Shipped with the package as `gpn_jax.configs.transformer_130m`, so an installed gpn_jax names it
`--config=transformer_130m`; this file lets the CLI name it by path, as the docs do.
"""

from gpn_jax.configs.transformer_130m import get_config

__all__ = ["get_config"]
