"""Tiny training configs and reading a finished run's state, shared by the training, eval and
I/O tests."""

import jax

from experiments.configs import gpn_m_tiny
from gpn_jax.checkpoints.manager import Checkpointer
from gpn_jax.checkpoints.restore import tokenizer_sha256
from gpn_jax.data.pipeline import build_data
from gpn_jax.models import factory
from gpn_jax.training import train_step as ts
from gpn_jax.training.loop import train_and_evaluate
from gpn_jax.training.optimizer import make_optimizer
from tests.tolerance import f32_bound


def train_on_one_device(config, workdir: str) -> dict:
    """`train_and_evaluate` on the first of the 8 test devices: the tests of the trainer's
    behaviour need no mesh (the sharded steps are tests/parallel's), and a tiny run costs about
    a third more CPU on 8 forced devices of 2 cores."""
    return train_and_evaluate(config, workdir, devices=jax.devices()[:1])


def tiny_config(**train):
    """gpn_m_tiny for 4 steps of batch 8 (the 8 test CPU devices), a checkpoint every 2 steps,
    logged every step, 2 held-out batches at the end; `train` overrides train fields."""
    c = gpn_m_tiny.get_config()
    c.train.update(
        dict(batch_size=8, steps=4, checkpoint_every=2, eval_every=0, log_every=1, eval_batches=2)
    )
    c.train.final_eval_batches = 2
    c.train.update(train)
    return c


def tiny_two_step_config():
    """gpn_m_tiny for 2 steps of batch 8 with synchronous checkpoints (a run to evaluate)."""
    c = gpn_m_tiny.get_config()
    c.train.update(dict(batch_size=8, steps=2, warmup_steps=1, eval_every=0, checkpoint_every=2))
    c.train.async_checkpoints = False
    return c


def final_state(workdir, config):
    """(step, train state, data state, metadata) of the newest checkpoint in `workdir`."""
    model = factory.build_model(config.model)
    opt = make_optimizer(config.train, model.weight_decay_mask)
    abstract = jax.eval_shape(lambda r: ts.init_train_state(model, opt, r), jax.random.PRNGKey(0))
    with Checkpointer(workdir, async_save=False, cleanup_tmp=False) as ckpt:
        step, state, data_state, _, meta = ckpt.restore(abstract)
    return step, state, data_state, meta


def tiny_bound(tokens: int, positions: int = 32, margin: float = 4) -> float:
    """Float32 bound (tests/tolerance.py) for gpn_m_tiny's (or gdn_tiny's: the same widths) loss,
    gradients or carry computed by two programs (another sharding, fusion or micro-batching):
    `positions` recurrent steps of reductions no longer than d_ffn = 128, the 512-way vocabulary
    logsumexp, then the sum over `tokens`; x4 for the backward pass retracing the chain."""
    return f32_bound(positions * 128 + 512 + tokens, margin)


def norm_bound(tokens: int, n_params: int, positions: int = 32) -> float:
    """`tiny_bound` plus the gradient norm's own sum of `n_params` squares (worst case n x eps)."""
    return tiny_bound(tokens, positions) + f32_bound(n_params, 1)


def save_tiny_run(workdir: str, step: int) -> None:
    """A gpn_m_tiny checkpoint at `step` in `workdir`, saved as training saves one: its data
    and tokenizer built there, the tokenizer's digest in the meta."""
    c = gpn_m_tiny.get_config()
    c.train.update(dict(batch_size=8, steps=step, async_checkpoints=False))
    model = factory.build_model(c.model)
    state = ts.init_train_state(
        model, make_optimizer(c.train, model.weight_decay_mask), jax.random.PRNGKey(1)
    )
    data = build_data(c.data.source, vocab_size=512, seq_len=32, batch_size=8, workdir=workdir,
                      seed=c.seed, heldout_fraction=c.data.heldout_fraction)  # fmt: skip
    with Checkpointer(workdir, keep=None, async_save=False) as ckpt:
        meta = {"step": step, "tokenizer_sha256": tokenizer_sha256(data.tokenizer)}
        ckpt.save(step, state, data.train.get_state(), c.to_dict(), meta, force=True)
