"""Shared ml_collections config pieces: the training recipe, the data block, and the `:arg` variants.

Every experiment config (`experiments/configs/*.py`) is `get_config(arg=None)` built on
`base_config`; `--config=path.py:cpu` shrinks any of them for a CPU run (small widths, short
windows, few steps) without touching the model family or recipe.
"""

import dataclasses
import enum

import ml_collections

from gpn_jax.models import configs as model_configs
from gpn_jax.models import factory


def base_config() -> ml_collections.ConfigDict:
    """The paper's recipe: AdamW 6e-4, 100 warm-up steps, cosine to 10 %, wd 0.1, clip 1.0."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.model = ml_collections.ConfigDict()  # filled by each experiment: family + its fields

    c.data = ml_collections.ConfigDict()
    c.data.source = (
        "embedded"  # embedded | <path to .txt/.jsonl file or dir> | tfds:<name> | bin:<dir>
    )
    c.data.data_dir = ""  # tfds data_dir (local or gs://)
    c.data.tokenizer_path = ""  # existing sentencepiece .model; empty: train one into the workdir
    c.data.heldout_fraction = 0.05  # share of documents held out (never read by training)
    c.data.bin_dtype = "uint32"  # token dtype of bin: shards
    c.data.text_field = "text"  # field of jsonl / tfds records holding the text
    # training window order: '' (automatic: 'streams' with train.carry_state, else shuffled),
    # 'shuffled', 'sequential' or 'streams' (gpn_jax.data.windows)
    c.data.train_layout = ""

    c.train = ml_collections.ConfigDict()
    c.train.batch_size = 128  # sequences per optimiser step (global, over all hosts)
    c.train.seq_len = 2048  # tokens per window (full BPTT over the window)
    c.train.grad_accum = 1  # micro-batches per optimiser step (batch_size must divide by it)
    c.train.steps = 10_000  # optimiser steps
    c.train.learning_rate = 6e-4  # peak LR
    c.train.warmup_steps = 100
    c.train.min_lr_ratio = 0.1  # cosine decays to this fraction of the peak
    c.train.weight_decay = 0.1  # matrices only (as the paper)
    c.train.b1 = 0.9
    c.train.b2 = 0.95
    c.train.grad_clip = 1.0  # global-norm clipping
    c.train.log_every = 10  # steps between metric rows / progress updates
    c.train.eval_every = 500  # steps between held-out evaluations (0: only at the end)
    c.train.eval_batches = (
        8  # held-out batches per periodic evaluation (0: the whole held-out split)
    )
    c.train.final_eval_batches = 0  # held-out batches of the final evaluation (0: all)
    c.train.final_eval_stride = 1  # k: the final evaluation reads every k-th held-out batch
    c.train.checkpoint_every = 500  # steps between checkpoints
    c.train.keep_checkpoints = 3  # last N checkpoints kept
    c.train.keep_best = 1  # plus the best M by held-out loss
    c.train.async_checkpoints = True
    # 'paper:<checkpoint.pkl>': start from the paper trainer's checkpoint (fresh workdir only;
    # see gpn_jax.training.init_from). '': from scratch.
    c.train.init_from = ""
    # Stateful training (truncated BPTT across windows): each batch row reads its own
    # contiguous stream ('streams' layout), the final carry of a step is the next step's
    # initial carry (no gradient through it), reset at every document start. GPN/GPN+M/GDN.
    c.train.carry_state = False
    # CPU backend: each step runs on the calling thread and its freed buffers stay in the C heap
    # for the next step, so a step does not page-fault its temporaries in afresh
    # (gpn_jax.training.host_memory; the `gpn-train` launcher, before JAX starts).
    c.train.reuse_step_memory = True

    c.logging = ml_collections.ConfigDict()
    c.logging.writers = "jsonl,tensorboard"  # comma-separated: jsonl, tensorboard, wandb
    c.logging.wandb_project = "gpn_jax"  # offline under <workdir>/wandb without WANDB_API_KEY
    # the lead host's log (gpn_jax.training.progress): True a tqdm bar, False one line per event,
    # None a bar when stderr is a terminal, else lines
    c.logging.progress_bar = ml_collections.FieldReference(None, field_type=bool)
    c.logging.peak_flops = 0.0  # one device's peak FLOP/s: logs MFU when set (0: not shown)

    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = -1  # -1: all remaining devices
    c.mesh.fsdp = 1
    c.mesh.tensor = 1
    # {logical axis a model declares: mesh axis ('' never split)}: how parameters and optimiser
    # state are sharded (gpn_jax.parallel.sharding.DEFAULT_AXIS_RULES, checked there), e.g.
    # --config.mesh.axis_rules.heads='' keeps memory heads whole on every device; a config file
    # may add a new family's axes. Optional in a config file: c.mesh.rules = [[regex over leaf
    # paths, spec], ...], tried before the axes.
    c.mesh.axis_rules = ml_collections.ConfigDict(
        {"embed": "fsdp", "ffn": "tensor", "heads": "tensor", "vocab": "tensor"}
    )
    return c


def tiny_train(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The `*_tiny` configs' training block: 20 steps of 4 x 32 tokens (CPU tests, smoke runs)."""
    c.train.update(
        dict(
            batch_size=4,
            seq_len=32,
            steps=20,
            warmup_steps=5,
            learning_rate=3e-3,
            log_every=5,
            eval_every=10,
            eval_batches=2,
            checkpoint_every=10,
        )
    )
    return c


def model_block(fields) -> ml_collections.ConfigDict:
    """A `model` block holding every field of its family's config dataclass: `fields` plus the
    dataclass defaults, so each one can be set from the command line
    (`--config.model.scan_impl=fused`); ml_collections only overrides fields that exist."""
    cfg = factory.family_config(fields)  # validates family and field names (no JAX)
    plain = lambda v: v.value if isinstance(v, enum.Enum) else v  # enums as their strings
    values = {k: plain(v) for k, v in dataclasses.asdict(cfg).items()}
    return ml_collections.ConfigDict(dict(family=fields.get("family", "gpn"), **values))


def with_model(arg: str | None, model: dict, **train) -> ml_collections.ConfigDict:
    """The shared recipe with this `model` block and these `train` fields, then `arg`'s
    variant (`apply_arg`): a named config is its model and what it trains differently."""
    c = base_config()
    c.model = ml_collections.ConfigDict(model)
    c.train.update(train)
    return apply_arg(c, arg)


def apply_arg(c: ml_collections.ConfigDict, arg: str | None) -> ml_collections.ConfigDict:
    """Completes the model block (`model_block`); `:cpu` shrinks the config for a quick CPU
    run, None leaves it unchanged."""
    c.model = model_block(c.model)
    if not arg:
        return c
    if arg != "cpu":
        raise ValueError(f"unknown config variant {arg!r}; the only variant is ':cpu'")
    # each model field's own `:cpu` rule (`models.configs`: vocab 2048, widths capped, ...)
    shrink = model_configs.field_rule(model_configs.CPU, type(factory.family_config(c.model)))
    for field, rule in shrink.items():
        c.model[field] = rule(c.model[field])
    c.train.batch_size, c.train.seq_len, c.train.steps = 8, 128, 200
    c.train.grad_accum = 1
    c.train.warmup_steps = 20
    c.train.learning_rate = 3e-3
    c.train.eval_every, c.train.eval_batches, c.train.checkpoint_every = 100, 4, 100
    c.train.log_every = 10
    return c
