"""Every config check, in one module, run before any expensive work (tokenizer training,
data, compilation).

Pure functions over the ml_collections config: each failure is one `ValueError` line naming
the knob that fixes it (`config.<block>.<field>`) and its allowed range. No JAX import.

* `check_static(config)`: what the config alone decides (ranges, types, divisibility by
  grad_accum). `gpn_jax.train` runs it before JAX is even imported.
* `check_mesh(config, data_parallel, process_count)`: the mesh-dependent checks (the batch
  split over grad_accum x data-parallel devices, and over hosts); the caller passes the sizes.
* `check_config(config, data_parallel, process_count)`: both; the trainer calls it once before
  it builds anything.
"""

import importlib.util
import math

from gpn_jax.configs import blocks
from gpn_jax.models import configs as model_configs
from gpn_jax.models import factory
from gpn_jax.models.bounds import (  # noqa: F401 - MAX_PARAMETERS, estimated_parameters: API
    INT32_MAX,
    MAX_PARAMETERS,
    check_model_size,
    estimated_parameters,
)
from gpn_jax.models.configs import COMPUTE_DTYPES

# Minimum allowed value of each integer field of the model families' configs (gpn, transformer,
# gdn), declared on the field (`models.configs.size` / `switch`). tests/training/test_validate.py
# checks that every int field of every family's config dataclass has one, so a new field cannot
# slip past unchecked.
MODEL_MINIMUM = model_configs.field_rule(model_configs.MINIMUM)
_MEMORY_FIELDS = ("n_heads", "d_key", "d_value")
# The train, data, logging and mesh fields' bounds are read from their declarations
# (`configs.blocks.rule`) at each check: a field declared there is checked here.


def _at_least(block: str, field: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        allowed = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"config.{block}.{field} must be {allowed}, got {value!r}")


def check_model(model_cfg) -> None:
    """Every size field of the model block in range (see MODEL_MINIMUM)."""
    m = dict(model_cfg)
    # a model with its memory switched off (GPN) may leave the memory's sizes 0
    without_memory = not m.get("memory", True) and "memory" in factory.config_fields(m)
    for field, minimum in MODEL_MINIMUM.items():
        if field not in m:
            continue
        if without_memory and field in _MEMORY_FIELDS:
            minimum = 0
        _at_least("model", field, m[field], minimum)
    if "bos_id" in m and m["bos_id"] >= m["vocab_size"]:
        raise ValueError(
            f"config.model.bos_id must be in [0, vocab_size={m['vocab_size']}), got {m['bos_id']}"
        )


def check_train(train_cfg) -> None:
    """Train sizes and ranges, divisibility of the batch by grad_accum, and a keep_best that
    can rank something (the mesh split: `check_batch_split`)."""
    t = train_cfg
    for field, minimum in blocks.rule("train", blocks.MINIMUM).items():
        _at_least("train", field, t[field], minimum)
    ranges = blocks.rule("train", blocks.RANGE)  # {field: (lowest, highest, highest allowed?)}
    low = ranges["learning_rate"][0]
    _finite_at_least(t.learning_rate, f"config.train.learning_rate must be >= {low:g}", low)
    ratio = t.min_lr_ratio
    if not _in_range(ratio, ranges["min_lr_ratio"]):
        raise ValueError(
            f"config.train.min_lr_ratio must be in {_interval(ranges['min_lr_ratio'])} "
            f"({blocks.doc('train', 'min_lr_ratio')}), got {ratio!r}"
        )
    clip = t.grad_clip
    if clip is not None and (not _number(clip) or not math.isfinite(clip) or clip < 0):
        raise ValueError(
            f"config.train.grad_clip must be > 0 (global-norm clipping) or 0 / None for no "
            f"clipping, got {clip!r}"
        )
    if t.batch_size % t.grad_accum:
        raise ValueError(
            f"config.train.batch_size must be a multiple of config.train.grad_accum "
            f"({t.grad_accum}), got {t.batch_size}"
        )
    _check_keep_best(t)


def check_batch_split(t, data_parallel: int, process_count: int = 1) -> None:
    """Mesh-dependent: the batch splits over grad_accum x data-parallel devices and hosts."""
    if t.batch_size % (t.grad_accum * data_parallel):
        raise ValueError(
            f"config.train.batch_size must be a multiple of grad_accum x data-parallel devices "
            f"(data x fsdp) = {t.grad_accum} x {data_parallel}, got {t.batch_size}"
        )
    if t.batch_size % process_count:
        raise ValueError(
            f"config.train.batch_size must be a multiple of the {process_count} hosts, "
            f"got {t.batch_size}"
        )


def _in_range(value, span: tuple) -> bool:
    """`value` a finite number in the declared `span` (lowest, highest, highest allowed?)."""
    low, high, closed = span
    ok = _number(value) and math.isfinite(value) and low <= value <= high
    return ok and (closed or value < high)


def _interval(span: tuple) -> str:
    low, high, closed = span
    return f"[{low:g}, {high:g}{']' if closed else ')'}"


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite_at_least(value, message: str, minimum: float) -> None:
    if not _number(value) or not math.isfinite(value) or value < minimum:
        raise ValueError(f"{message}, got {value!r}")


def _check_keep_best(t) -> None:
    """keep_best ranks checkpoints by the held-out loss of an evaluation on a checkpoint step.

    Runs without periodic evaluation (eval_every=0, or shorter than eval_every) have nothing
    to rank and are allowed (the latest checkpoints are kept); a run that evaluates, but
    never on a checkpoint step (the final step is always one), is a config mistake.
    """
    if not t.keep_best or not t.eval_every or t.steps < t.eval_every:
        return
    lands = math.lcm(t.eval_every, t.checkpoint_every) <= t.steps or t.steps % t.eval_every == 0
    if not lands:
        raise ValueError(
            f"config.train.keep_best={t.keep_best} needs an evaluation on a checkpoint step, "
            f"but eval_every={t.eval_every} never lands on one of checkpoint_every="
            f"{t.checkpoint_every} within steps={t.steps}; make eval_every a multiple of "
            "checkpoint_every or set keep_best=0"
        )


def check_stateful(config, data_parallel: int | None = None) -> None:
    """Stateful training (`train.carry_state`) needs a model with a carry and the 'streams'
    window layout; with `data_parallel` (mesh-dependent), its streams (one per batch row)
    must split evenly over micro-batches and devices."""
    t = config.train
    if not t.carry_state:
        return
    if not factory.family(config.model).recurrent:
        recurrent = " or ".join(f.name for f in factory.FAMILIES.values() if f.recurrent)
        raise ValueError(
            f"config.train.carry_state=true needs a recurrent model (family {recurrent}); the "
            f"{factory.family_name(config.model)} model carries no state across windows"
        )
    layout = config.data.train_layout
    if layout and layout != "streams":
        raise ValueError(
            "config.train.carry_state=true reads one contiguous stream per batch row: "
            f"config.data.train_layout must be 'streams' (or '' for automatic), got {layout!r}"
        )
    if data_parallel is None:
        return
    split = t.grad_accum * data_parallel
    if t.batch_size % split:
        raise ValueError(
            f"config.train.carry_state=true: the {t.batch_size} streams (one per batch row, "
            f"config.train.batch_size) must split evenly over grad_accum x data-parallel "
            f"devices = {t.grad_accum} x {data_parallel}"
        )


def check_data(data_cfg) -> None:
    f, span = data_cfg.heldout_fraction, blocks.rule("data", blocks.RANGE)["heldout_fraction"]
    if not _in_range(f, span):
        raise ValueError(f"config.data.heldout_fraction must be in {_interval(span)}, got {f!r}")


def check_logging(config) -> None:
    """`config.logging.writers` names at least one known writer (with none, a run would leave
    no record of itself), and wandb only where it is installed."""
    spec = config.logging.writers
    if not isinstance(spec, str):
        raise ValueError(f"config.logging.writers must be a comma-separated string, got {spec!r}")
    names = [n.strip() for n in spec.split(",") if n.strip()]
    known = blocks.rule("logging", blocks.CHOICES)["writers"]
    if not names:
        raise ValueError(
            f"config.logging.writers is empty, so the run would write no metrics.jsonl or "
            f"run_info; name at least one of {','.join(known)}"
        )
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(
            f"unknown metric writer {unknown[0]!r} in config.logging.writers={spec!r}; "
            f"choose from {','.join(known)}"
        )
    if "wandb" in names and importlib.util.find_spec("wandb") is None:
        raise ValueError(
            "config.logging.writers names wandb, which is not installed: "
            "pip install 'gpn_jax[wandb]'"
        )


def check_remat_segment(config) -> None:
    """The window splits into whole remat segments (`core.autodiff_window` checks it again)."""
    segment, seq_len = config.model.get("remat_segment", 0), config.train.seq_len
    if segment and seq_len % segment:
        raise ValueError(
            f"sequence length {seq_len} is not divisible by the remat segment {segment}: make "
            "config.train.seq_len a multiple of config.model.remat_segment (or set it to 0)"
        )


def check_compute_dtype(model_cfg) -> None:
    dtype = dict(model_cfg).get("compute_dtype", "float32")
    if dtype not in COMPUTE_DTYPES:
        raise ValueError(
            f"config.model.compute_dtype must be one of {', '.join(COMPUTE_DTYPES)}, got {dtype!r}"
        )


def check_static(config) -> None:
    """Every check the config alone decides; a one-line ValueError on the first bad field."""
    check_model(config.model)
    check_compute_dtype(config.model)
    check_stateful(config)
    check_train(config.train)
    check_remat_segment(config)
    check_data(config.data)
    check_logging(config)
    check_bounds(config)
    parse_init_from(config.train.init_from)


INIT_FROM_SCHEMES = ("paper",)
_INIT_FROM_USAGE = "expected paper:<checkpoint.pkl or the directory holding it>"


def parse_init_from(spec: str) -> tuple[str, str] | None:
    """`train.init_from`: '' -> None; 'paper:PATH' -> ('paper', PATH); anything else is a
    one-line ValueError (here, so that `gpn_jax.train` reports it before importing JAX)."""
    if not spec:
        return None
    scheme, sep, path = spec.partition(":")
    if not sep or scheme not in INIT_FROM_SCHEMES or not path:
        raise ValueError(f"train.init_from={spec!r}: {_INIT_FROM_USAGE}")
    return scheme, path


def check_mesh(config, data_parallel: int, process_count: int = 1, tensor: int = 1) -> None:
    """The mesh-dependent checks: the batch (and a stateful run's streams) split evenly over
    grad_accum x `data_parallel` devices and over `process_count` hosts; explicit kernels only
    where they run (per data / fsdp shard, not split over `tensor`)."""
    check_stateful(config, data_parallel)
    check_batch_split(config.train, data_parallel, process_count)
    check_kernels_mesh(config.model, tensor)


def check_kernels_mesh(model, tensor: int) -> None:
    """The memory kernels run per device or per data / fsdp shard; a window split over
    `tensor` keeps the XLA formulas, so an explicit `native` / `pallas` there is refused
    (`auto` falls back by itself)."""
    choice = model.get("kernels", "auto")
    if tensor > 1 and choice in ("native", "pallas"):
        raise ValueError(
            f"config.model.kernels={choice} runs per data/fsdp shard, not over a tensor-parallel "
            f"mesh (mesh.tensor={tensor}); use --config.model.kernels=auto or xla"
        )


def check_config(
    config, data_parallel: int | None = None, process_count: int = 1, tensor: int = 1
) -> None:
    """`check_static`, then `check_mesh` when the mesh's data-parallel size is given."""
    check_static(config)
    if data_parallel is not None:
        check_mesh(config, data_parallel, process_count, tensor)


# ---- Upper bounds (issue 51): every numeric field bounded above, finite, int32 where it lands
# in int32 (the step counter, schedules, window and position indices), and the model's size
# bounded before anything is allocated. Kept apart from the minimums above.

SEED_MAX = 2**32 - 1  # jax.random.PRNGKey keeps 32 bits of the seed; larger seeds would collide


def check_bounds(config) -> None:
    """Upper bounds of every numeric field: train counts in int32, finite train floats in their
    ranges, tokens per step in int32, the seed in [0, 2^32), mesh axes (and their minimum),
    and the model's size
    (`check_model_size`). One ValueError line naming the field."""
    t = config.train
    for field, minimum in blocks.rule("mesh", blocks.MINIMUM).items():
        _at_least("mesh", field, config.mesh[field], minimum)
    for block in ("train", "mesh"):
        for field, maximum in blocks.rule(block, blocks.MAXIMUM).items():
            _at_most(block, field, config[block][field], maximum)
    for field, span in blocks.rule("train", blocks.RANGE).items():
        value = t[field]
        if field == "grad_clip" and value is None:
            continue
        if not _in_range(value, span):
            raise ValueError(
                f"config.train.{field} must be a finite number in {_interval(span)}, got {value!r}"
            )
    tokens = t.batch_size * t.seq_len
    if tokens > INT32_MAX:
        raise ValueError(
            f"config.train.batch_size x config.train.seq_len = {tokens} tokens per step, over "
            f"the int32 limit {INT32_MAX}; lower config.train.batch_size or seq_len"
        )
    seed = config.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise ValueError(f"config.seed must be an integer in [0, 2^32 - 1], got {seed!r:.60}")
    check_model_size(config.model)


def _at_most(block: str, field: str, value, maximum: int) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and value > maximum:
        why = " (int32)" if maximum == INT32_MAX else ""
        raise ValueError(
            f"config.{block}.{field} must be at most {maximum}{why}, got {value!r:.60}"
        )
