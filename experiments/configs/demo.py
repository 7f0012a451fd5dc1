"""The main job's config, shipped with the package as `gpn_jax.configs.demo` (so the Python
quickstart works from an installed package); this file lets the CLI name it by path:

    python -m gpn_jax.train --config=experiments/configs/demo.py --workdir=runs/demo
"""

from gpn_jax.configs.demo import get_config

__all__ = ["get_config"]
