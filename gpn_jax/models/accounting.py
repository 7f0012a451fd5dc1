"""Parameter counts (by group) and FLOPs per token of any model, without allocating weights."""

import math

import jax

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
    *,
    matrices: int,
    head: int,
    residual_width: int,
    mixer: float,
    vocab: int,
    weight_bytes: int,
    batch_size: int,
    seq_len: int,
    loss_chunk: int,
    remat: bool,
) -> dict:
    """Analytic training-step memory traffic per token of a model whose layers each run on the
    whole (B, T) window at once (Transformer++, Gated DeltaNet), by term as
    `GPN.bytes_per_token`, with the same assumption (nothing stays in cache between two uses):

      weights      every layer matrix read once by the forward and once by the backward (a
                   second forward with remat), shared by all B*T tokens of the step; the head
                   (`head` elements) read twice per loss chunk of C positions and its float32
                   gradient read + written, shared by the chunk's C*B tokens (as GPN);
      weight_grads float32 gradient of every layer matrix read + written once per step;
      activations  float32: each layer's saved residuals (`residual_width` per token, all
                   layers) written and read, and their cotangents written and read;
      mixer        the token mixer's own traffic (attention scores, delta-rule chunk states),
                   given by the family;
      logits       as GPN: (V,) float32 written, read; their gradient written, read by two matmuls.
    """
    tokens = batch_size * seq_len
    chunk = loss_lib.chunk_size(seq_len, loss_chunk)
    passes = 3 if remat else 2
    out = {
        "weights": passes * matrices * weight_bytes / tokens
        + (2 * weight_bytes + 8) * head / (chunk * batch_size),
        "weight_grads": 8 * matrices / tokens,
        "activations": 4 * 4 * residual_width,
        "mixer": mixer,
        "logits": 5 * 4 * vocab,
    }
    out["train"] = sum(out.values())
    return out


def summary(model, seq_len: int) -> dict:
    """Everything `gpn_jax.summary` prints: parameter counts and FLOPs per token."""
    counts = param_counts(model)
    return {"params": counts, "flops_per_token": model.flops_per_token(seq_len), "seq_len": seq_len}
