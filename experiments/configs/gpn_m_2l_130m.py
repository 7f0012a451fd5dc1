"""GPN+M, two predict layers, 130M parameters (the paper's two-layer GPN+M).

Shipped with the package as `gpn_jax.configs.gpn_m_2l_130m`, so an installed gpn_jax names it
`--config=gpn_m_2l_130m`; this file lets the CLI name it by path, as the docs do.
"""

from gpn_jax.configs.gpn_m_2l_130m import get_config

__all__ = ["get_config"]
