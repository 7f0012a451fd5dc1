"""The train, data, logging and mesh blocks of a run config: each field declared once.

A field's type (the annotation), default, bounds, `:cpu` value and one-line doc live on its
declaration below (frozen dataclasses, as `models.configs` declares the model block); nothing
else restates them. `recipe.base_config` builds the ConfigDict blocks from these
(`config_block`), `training.validate` reads the bounds (`rule`), `recipe.apply_arg` the `:cpu`
values, and `complete` fills what a config saved before a field existed lacks, so readers read
`config.train.x` and never restate its default.
"""

import dataclasses
import types
import typing

import ml_collections

from gpn_jax.models.bounds import INT32_MAX
from gpn_jax.models.configs import CPU, MINIMUM, becomes

DOC, MAXIMUM, RANGE, CHOICES = "doc", "maximum", "range", "choices"  # the metadata keys
MESH_MAXIMUM = 1 << 20  # devices along one mesh axis


def count(default: int, doc: str, *, minimum: int = 1, maximum: int = INT32_MAX, cpu=None):
    """An integer in [minimum, maximum] (int32 unless told); `cpu`: its `:cpu` value."""
    rules = {DOC: doc, MINIMUM: minimum, MAXIMUM: maximum, CPU: _cpu(cpu)}
    return dataclasses.field(default=default, metadata=rules)


def number(default: float, doc: str, *, low: float, high: float, closed: bool = True, cpu=None):
    """A finite float in [low, high] (`closed`) or [low, high)."""
    rules = {DOC: doc, RANGE: (low, high, closed), CPU: _cpu(cpu)}
    return dataclasses.field(default=default, metadata=rules)


def plain(default, doc: str, *, choices: tuple | None = None):
    """Any other field (a string, a switch); `choices`: the names it may list."""
    if isinstance(default, dict):
        return dataclasses.field(default_factory=lambda: dict(default), metadata={DOC: doc})
    return dataclasses.field(default=default, metadata={DOC: doc, CHOICES: choices})


def _cpu(value):
    return None if value is None else becomes(value)


@dataclasses.dataclass(frozen=True)
class Train:
    """The optimiser, schedule, evaluation and checkpoint cadence (the paper's recipe)."""

    batch_size: int = count(128, "sequences per optimiser step (global, over all hosts)", cpu=8)
    seq_len: int = count(2048, "tokens per window (full BPTT over the window)", cpu=128)
    grad_accum: int = count(1, "micro-batches per step (batch_size divides by it)", cpu=1)
    steps: int = count(10_000, "optimiser steps", cpu=200)
    learning_rate: float = number(6e-4, "peak learning rate", low=0.0, high=10.0, cpu=3e-3)
    warmup_steps: int = count(100, "linear warm-up steps", minimum=0, cpu=20)
    min_lr_ratio: float = number(
        0.1, "the cosine's end as a fraction of the peak learning rate", low=0.0, high=1.0
    )
    weight_decay: float = number(
        0.1, "AdamW decay, matrices only (as the paper)", low=0.0, high=10.0
    )
    # 1 never forgets the first gradient (b1) / divides by zero in the bias correction (b2)
    b1: float = number(0.9, "Adam's first-moment decay", low=0.0, high=1.0, closed=False)
    b2: float = number(0.95, "Adam's second-moment decay", low=0.0, high=1.0, closed=False)
    grad_clip: float = number(1.0, "global-norm clipping (0 or None: none)", low=0.0, high=1e9)
    log_every: int = count(10, "steps between metric rows / progress updates", cpu=10)
    eval_every: int = count(
        500, "steps between held-out evaluations (0: only at the end)", minimum=0, cpu=100
    )
    eval_batches: int = count(
        8, "held-out batches per periodic evaluation (0: the whole split)", minimum=0, cpu=4
    )
    final_eval_batches: int = count(
        0, "held-out batches of the final evaluation (0: all)", minimum=0
    )
    final_eval_stride: int = count(1, "k: the final evaluation reads every k-th held-out batch")
    checkpoint_every: int = count(500, "steps between checkpoints", cpu=100)
    keep_checkpoints: int = count(3, "the last N checkpoints kept")
    keep_best: int = count(1, "plus the best M by held-out loss", minimum=0)
    async_checkpoints: bool = plain(True, "save checkpoints in the background")
    # fresh workdir only; see gpn_jax.training.init_from
    init_from: str = plain("", "'paper:<checkpoint.pkl>': start from the paper trainer's state")
    # Truncated BPTT across windows: each batch row reads its own contiguous stream ('streams'
    # layout), a step's final carry is the next step's initial one (no gradient through it),
    # reset at every document start. GPN/GPN+M/GDN.
    carry_state: bool = plain(False, "stateful training: the carry goes on across windows")
    # CPU backend: each step runs on the calling thread and its freed buffers stay in the C
    # heap for the next step, so a step does not page-fault its temporaries in afresh
    # (gpn_jax.training.host_memory; the `gpn-train` launcher, before JAX starts)
    reuse_step_memory: bool = plain(True, "CPU: steps on the calling thread, heap kept")


@dataclasses.dataclass(frozen=True)
class Data:
    """Where the tokens come from and how they are split and ordered."""

    source: str = plain(
        "embedded", "embedded | <.txt/.jsonl file or dir> | tfds:<name> | bin:<dir> | recall:<..>"
    )
    data_dir: str = plain("", "tfds data_dir (local or gs://)")
    tokenizer_path: str = plain(
        "", "existing sentencepiece .model; empty: train one into the workdir"
    )
    heldout_fraction: float = number(
        0.05, "share of documents held out (never trained on)", low=0.0, high=1.0, closed=False
    )
    bin_dtype: str = plain("uint32", "token dtype of bin: shards")
    text_field: str = plain("text", "field of jsonl / tfds records holding the text")
    # '' is 'streams' with train.carry_state, else shuffled (gpn_jax.data.windows)
    train_layout: str = plain("", "window order: '' (automatic), shuffled, sequential, streams")


@dataclasses.dataclass(frozen=True)
class Logging:
    """What the run writes and shows."""

    writers: str = plain(
        "jsonl,tensorboard",
        "comma-separated metric writers",
        choices=("jsonl", "tensorboard", "wandb"),
    )
    wandb_project: str = plain("gpn_jax", "offline under <workdir>/wandb without WANDB_API_KEY")
    # the lead host's log (gpn_jax.training.progress)
    progress_bar: bool | None = plain(None, "True a tqdm bar, False lines, None a bar on a tty")
    peak_flops: float = plain(0.0, "one device's peak FLOP/s: logs MFU when set (0: not shown)")


@dataclasses.dataclass(frozen=True)
class Mesh:
    """How the devices are laid out, and how parameters are sharded over them."""

    data: int = count(
        -1, "data-parallel devices (-1: all remaining)", minimum=-1, maximum=MESH_MAXIMUM
    )
    fsdp: int = count(1, "devices parameters are sharded over", maximum=MESH_MAXIMUM)
    tensor: int = count(1, "tensor-parallel devices", maximum=MESH_MAXIMUM)
    # {logical axis a model declares: mesh axis ('' never split)} (gpn_jax.parallel.sharding's
    # DEFAULT_AXIS_RULES, checked there), e.g. --config.mesh.axis_rules.heads='' keeps memory
    # heads whole on every device; a config file may add a new family's axes. Optional in a
    # config file: c.mesh.rules = [[regex over leaf paths, spec], ...], tried before the axes.
    axis_rules: dict = plain(
        {"embed": "fsdp", "ffn": "tensor", "heads": "tensor", "vocab": "tensor"},
        "{logical axis: mesh axis} of parameters and optimiser state",
    )


# {block name: its declaration}, in a config's order; everything reads the blocks from here
BLOCKS = {"data": Data, "train": Train, "logging": Logging, "mesh": Mesh}


def rule(block: str, key: str) -> dict:
    """{field name: its rule `key` (MINIMUM, MAXIMUM, RANGE, CHOICES, CPU)} of the fields of
    `block` ('train', 'data', 'logging' or 'mesh') that set it."""
    fields = dataclasses.fields(BLOCKS[block])
    return {f.name: f.metadata[key] for f in fields if f.metadata.get(key) is not None}


def doc(block: str, field: str) -> str:
    """The one-line doc of `block`'s `field`."""
    return BLOCKS[block].__dataclass_fields__[field].metadata[DOC]


def fields_help(width: int = 100) -> str:
    """Every declared field as `--help` lists it: `--config.<block>.<field>` (its default, its
    bounds), then its doc, each line within `width` columns."""
    import textwrap

    lines = ["config fields (override any with --config.<block>.<field>=VALUE):"]
    for name, cls in BLOCKS.items():
        for f in dataclasses.fields(cls):
            m, bounds = f.metadata, ""
            if m.get(MINIMUM) is not None:
                bounds = f", {m[MINIMUM]} to {m[MAXIMUM]}" if m[MAXIMUM] < INT32_MAX else (
                    f", at least {m[MINIMUM]}")  # fmt: skip
            elif m.get(RANGE):
                low, high, closed = m[RANGE]
                bounds = f", in [{low:g}, {high:g}{']' if closed else ')'}"
            head = f"--config.{name}.{f.name} (default {default(f)!r}{bounds})"
            lines += textwrap.wrap(head, width, initial_indent="  ", subsequent_indent=" " * 6)
            lines += textwrap.wrap(m[DOC], width, initial_indent=" " * 4, subsequent_indent=" " * 4)
    return "\n".join(lines)


def default(f: dataclasses.Field):
    """A declared field's default value (a fresh one for a dict)."""
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _value(f: dataclasses.Field):
    """The ConfigDict value of `f`'s default: a None default keeps its type (overridable from
    the command line as that type)."""
    value = default(f)
    if value is None:
        kind = next(t for t in typing.get_args(f.type) if t is not types.NoneType)
        return ml_collections.FieldReference(None, field_type=kind)
    return ml_collections.ConfigDict(value) if isinstance(value, dict) else value


def config_block(block: str) -> ml_collections.ConfigDict:
    """A ConfigDict of every declared field of `block` at its default."""
    c = ml_collections.ConfigDict()
    for f in dataclasses.fields(BLOCKS[block]):
        c[f.name] = _value(f)
    return c


def complete(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` (changed in place, and returned) with every declared block and field it lacks
    at its default: a config saved by an older version, or written without `base_config`,
    reads as today's. Fields it has are left as they are."""
    with config.unlocked():
        for name, cls in BLOCKS.items():
            if name not in config:
                config[name] = config_block(name)
                continue
            for f in dataclasses.fields(cls):
                if f.name not in config[name]:
                    config[name][f.name] = _value(f)
    return config
