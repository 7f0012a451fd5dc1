"""Causal ablations (not in the paper): held-out PPL with parts of the computation removed.

Every ablation is a `gpn_jax.core.gpn.Intervention`, evaluated with one jitted loss whose
intervention always has all three fields set: the identity is `direction = 0` (subtracts an
exact 0), `head_mask = 1` and `read_scale = 1` (multiply by an exact 1), so the unablated row
is bit-identical to the plain model and all rows share one compilation. Interventions run on
the reference `autodiff` scan (`GPN.autodiff`): the default fused window refuses them.

Rows:
  base          the model unchanged
  mean_dir      s-bar's direction projected out of the predicted state before decode and ground
  random_dir    a random unit direction projected out the same way (control for mean_dir)
  fast_heads    the fast-pool heads' reads zeroed (o_h = 0 before the output norm)
  slow_heads    the slow-pool heads' reads zeroed
  no_read       the whole memory read term zeroed (read_scale = 0)
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from gpn_jax.analysis.collect import micro_size
from gpn_jax.core import gpn
from gpn_jax.core.gpn import Intervention

LABELS = {
    "base": "(a) unchanged",
    "mean_dir": "(b) s̄ direction projected out",
    "random_dir": "(b') random direction projected out (control)",
    "fast_heads": "(c) fast-pool heads' reads zeroed",
    "slow_heads": "(d) slow-pool heads' reads zeroed",
    "no_read": "(e) whole memory read zeroed",
}


def identity(d: int, n_heads: int) -> Intervention:
    """The no-op intervention with every field set (see the module doc)."""
    return Intervention(
        direction=jnp.zeros((d,), jnp.float32),
        head_mask=jnp.ones((max(n_heads, 1),), jnp.float32),
        read_scale=jnp.ones((), jnp.float32),
    )


def unit(v) -> jax.Array:
    v = np.asarray(v, np.float64)
    n = np.linalg.norm(v)
    if n == 0:
        raise ValueError("cannot project out a zero direction")
    return jnp.asarray(v / n, jnp.float32)


def head_mask(n_heads: int, zeroed: list[int]) -> jax.Array:
    m = np.ones(n_heads, np.float32)
    m[list(zeroed)] = 0.0
    return jnp.asarray(m)


def interventions(params, mean_dir, pools: dict | None, seed: int = 0) -> dict:
    """name -> Intervention for every applicable row (head rows need memory and a non-empty pool)."""
    d = params["decode"]["norm"].shape[0]
    mem = gpn.memory_shape(params)
    h = mem[0] if mem else 1
    base = identity(d, h)
    rng = np.random.default_rng(seed)
    rows = {
        "base": base,
        "mean_dir": base._replace(direction=unit(mean_dir)),
        "random_dir": base._replace(direction=unit(rng.standard_normal(d))),
    }
    if mem is not None:
        if pools and pools["fast"]:
            rows["fast_heads"] = base._replace(head_mask=head_mask(h, pools["fast"]))
        if pools and pools["slow"]:
            rows["slow_heads"] = base._replace(head_mask=head_mask(h, pools["slow"]))
        rows["no_read"] = base._replace(read_scale=jnp.zeros((), jnp.float32))
    return rows


def ablation_ppl(
    model, params, windows, ivs: dict, max_batches: int = 0, micro_batch: int = 0
) -> dict:
    """Held-out loss / PPL of each intervention over the same windows (one pass, one compile).

    Per batch the mean CE over all B*T positions (training's loss); batches weighted by tokens.
    micro_batch > 0 evaluates each batch that many windows at a time (bounds device memory).
    Returns {'rows': {name: {loss, ppl, label, delta_loss, ppl_ratio}}, 'tokens': n}.
    """
    # interventions run on the reference scan (`GPN.autodiff`; the fused window refuses them)
    model = model.autodiff() if hasattr(model, "autodiff") else model
    loss_fn = jax.jit(lambda p, x, iv: model.loss(p, x, iv=iv)[0])
    totals = dict.fromkeys(ivs, 0.0)
    tokens = 0
    for i, batch in enumerate(windows):
        if max_batches and i >= max_batches:
            break
        batch = np.asarray(batch, np.int32)
        mb = micro_size(batch.shape[0], micro_batch)
        for r0 in range(0, batch.shape[0], mb):
            part = batch[r0 : r0 + mb]
            for name, iv in ivs.items():
                totals[name] += float(loss_fn(params, part, iv)) * part.size
        tokens += batch.size
    if not tokens:
        raise ValueError("no held-out windows for the ablations")
    rows = {}
    for name, total in totals.items():
        loss = total / tokens
        rows[name] = {"loss": loss, "ppl": math.exp(loss), "label": LABELS.get(name, name)}
    base = rows.get("base")
    if base:
        for row in rows.values():
            row["delta_loss"] = row["loss"] - base["loss"]
            row["ppl_ratio"] = row["ppl"] / base["ppl"]
    return {"rows": rows, "tokens": tokens}
