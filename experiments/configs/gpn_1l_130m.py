"""GPN (no memory), one predict layer, 130M parameters, as in the paper.

Shipped with the package as `gpn_jax.configs.gpn_1l_130m`, so an installed gpn_jax names it
`--config=gpn_1l_130m`; this file lets the CLI name it by path, as the docs do.
"""

from gpn_jax.configs.gpn_1l_130m import get_config

__all__ = ["get_config"]
