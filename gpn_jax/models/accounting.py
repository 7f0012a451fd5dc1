"""Parameter counts (by group) and FLOPs per token of any model, without allocating weights."""

import math

import jax


def abstract_params(model):
    """Shapes and dtypes of `model.init` (no memory is allocated)."""
    return jax.eval_shape(model.init, jax.random.PRNGKey(0))


def param_counts(model) -> dict:
    """{'groups': {top-level group: count}, 'total': count}."""
    shapes = abstract_params(model)
    groups = {
        name: sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(sub))
        for name, sub in shapes.items()
    }
    return {"groups": groups, "total": sum(groups.values())}


def bytes_per_token(model, batch_size: int, seq_len: int) -> dict | None:
    """The model's analytic training-step memory traffic per token by term ('train': the sum),
    or None for a family without a byte model (see e.g. `GPN.bytes_per_token`)."""
    fn = getattr(model, "bytes_per_token", None)
    return None if fn is None else fn(batch_size, seq_len)


def summary(model, seq_len: int) -> dict:
    """Everything `gpn_jax.summary` prints: parameter counts and FLOPs per token."""
    counts = param_counts(model)
    return {"params": counts, "flops_per_token": model.flops_per_token(seq_len), "seq_len": seq_len}
