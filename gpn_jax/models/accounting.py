"""Parameter counts (by group) and FLOPs per token of any model, without allocating weights."""

import math

import jax
import jax.numpy as jnp

from gpn_jax.core import loss as loss_lib


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


def layer_parallel_bytes(
    config, batch_size: int, seq_len: int, *, matrices: int, residual_width: int, mixer: float
) -> dict:
    """Analytic training-step memory traffic per token of a model whose layers each run on the
    whole (B, T) window at once (Transformer++, Gated DeltaNet), by term as
    `GPN.bytes_per_token`, with the same assumption (nothing stays in cache between two uses):

      weights      every layer matrix read once by the forward and once by the backward (a
                   second forward with `config.remat`), shared by all B*T tokens of the step;
                   the V x d head (or tied embedding) read twice per loss chunk of C positions
                   and its float32 gradient read + written, shared by the chunk's C*B tokens
                   (as GPN); matrices in `config.compute_dtype`;
      weight_grads float32 gradient of every layer matrix read + written once per step;
      activations  float32: each layer's saved residuals (`residual_width` per token, all
                   layers) written and read, and their cotangents written and read;
      mixer        the token mixer's own traffic (attention scores, delta-rule chunk states),
                   given by the family;
      logits       as GPN: (V,) float32 written, read; their gradient written, read by two matmuls.
    """
    c, tokens = config, batch_size * seq_len
    w = jnp.dtype(c.compute_dtype).itemsize
    chunk = loss_lib.chunk_size(seq_len, c.loss_chunk)
    passes = 3 if c.remat else 2
    out = {
        "weights": passes * matrices * w / tokens
        + (2 * w + 8) * c.vocab_size * c.d_model / (chunk * batch_size),
        "weight_grads": 8 * matrices / tokens,
        "activations": 4 * 4 * residual_width,
        "mixer": mixer,
        "logits": 5 * 4 * c.vocab_size,
    }
    out["train"] = sum(out.values())
    return out


def summary(model, seq_len: int) -> dict:
    """Everything `gpn_jax.summary` prints: parameter counts and FLOPs per token."""
    counts = param_counts(model)
    return {"params": counts, "flops_per_token": model.flops_per_token(seq_len), "seq_len": seq_len}
