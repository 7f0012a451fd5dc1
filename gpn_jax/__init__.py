"""gpn_jax: Grounded Prediction Networks (GPN, GPN+M) in JAX, with baselines and a trainer."""

from gpn_jax.io.platforms import keep_libtpu_quiet as _keep_libtpu_quiet

_keep_libtpu_quiet()
