"""The paper's optimiser: AdamW, linear warm-up then cosine to a fraction of the peak, clipping.

The chain has exactly the structure of the paper code's optimiser
(`chain(clip_by_global_norm, adamw(schedule, mask=...))`), so its optimiser state can be
loaded through `gpn_jax.checkpoints.paper_pickle` and a run continued
(`gpn_jax.training.init_from`; the test there checks the next step against the paper's recipe built with optax directly).
"""

import optax


def learning_rate_schedule(train_cfg) -> optax.Schedule:
    """0 -> peak over `warmup_steps`, then cosine to `min_lr_ratio * peak` at `steps`."""
    peak = train_cfg.learning_rate
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=peak,
        warmup_steps=train_cfg.warmup_steps,
        decay_steps=max(train_cfg.steps, train_cfg.warmup_steps + 1),
        end_value=peak * train_cfg.min_lr_ratio,
    )


def make_optimizer(train_cfg, decay_mask) -> optax.GradientTransformation:
    """AdamW (decoupled weight decay on `decay_mask` leaves only) after global-norm clipping."""
    return optax.chain(
        # grad_clip 0 (or None): no clipping, same chain structure (validate refuses < 0)
        optax.clip_by_global_norm(train_cfg.grad_clip or float("inf")),
        optax.adamw(
            learning_rate_schedule(train_cfg),
            b1=train_cfg.b1,
            b2=train_cfg.b2,
            weight_decay=train_cfg.weight_decay,
            mask=decay_mask,
        ),
    )
