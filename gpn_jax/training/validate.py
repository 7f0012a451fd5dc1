"""Config checks that run before any expensive work (tokenizer training, data, compilation).

Pure functions over the ml_collections config: each failure is one `ValueError` line naming
the field (`config.<block>.<field>`) and its allowed range. No JAX import: the data-parallel
size of the mesh is passed in by the caller.
"""

import math

# Minimum allowed value of each integer size field of the model families' configs
# (gpn, transformer, gdn). tests/training/test_validate.py checks that every int field of every
# family's config dataclass is listed here, so a new field cannot slip past unchecked.
MODEL_MINIMUM = {
    "vocab_size": 1,
    "d_model": 1,
    "d_emb": 1,
    "d_ffn": 1,
    "n_layers": 1,
    "n_heads": 1,  # gpn without memory: 0 (see _memory_fields)
    "d_key": 1,
    "d_value": 1,
    "loss_chunk": 1,
    "max_seq_len": 1,
    "conv_size": 1,
    "chunk_size": 0,  # gdn: 0 selects the recurrent form
    "remat_segment": 0,  # 0: no segmented remat
    "bos_id": 0,
}
_GPN_MEMORY_FIELDS = ("n_heads", "d_key", "d_value")

# Minimum of each train field (all integers).
TRAIN_MINIMUM = {
    "batch_size": 1,
    "seq_len": 1,
    "grad_accum": 1,
    "steps": 1,
    "warmup_steps": 0,
    "log_every": 1,
    "eval_every": 0,  # 0: evaluate only at the end
    "eval_batches": 0,  # 0: the whole held-out split
    "final_eval_batches": 0,
    "final_eval_stride": 1,
    "checkpoint_every": 1,
    "keep_checkpoints": 1,
    "keep_best": 0,
}


def _at_least(block: str, field: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        allowed = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"config.{block}.{field} must be {allowed}, got {value!r}")


def check_model(model_cfg) -> None:
    """Every size field of the model block in range (see MODEL_MINIMUM)."""
    m = dict(model_cfg)
    gpn_without_memory = m.get("family", "gpn") == "gpn" and not m.get("memory", True)
    for field, minimum in MODEL_MINIMUM.items():
        if field not in m:
            continue
        if gpn_without_memory and field in _GPN_MEMORY_FIELDS:
            minimum = 0
        _at_least("model", field, m[field], minimum)
    if "bos_id" in m and m["bos_id"] >= m["vocab_size"]:
        raise ValueError(
            f"config.model.bos_id must be in [0, vocab_size={m['vocab_size']}), got {m['bos_id']}"
        )


def check_train(train_cfg, data_parallel: int = 1) -> None:
    """Train sizes, divisibility of the batch, and a keep_best that can rank something."""
    t = train_cfg
    for field, minimum in TRAIN_MINIMUM.items():
        if field in t:
            _at_least("train", field, t[field], minimum)
    if not t.learning_rate >= 0 or not math.isfinite(t.learning_rate):
        raise ValueError(f"config.train.learning_rate must be >= 0, got {t.learning_rate}")
    if t.batch_size % t.grad_accum:
        raise ValueError(
            f"config.train.batch_size must be a multiple of config.train.grad_accum "
            f"({t.grad_accum}), got {t.batch_size}"
        )
    if t.batch_size % (t.grad_accum * data_parallel):
        raise ValueError(
            f"config.train.batch_size must be a multiple of grad_accum x data-parallel devices "
            f"(data x fsdp) = {t.grad_accum} x {data_parallel}, got {t.batch_size}"
        )
    _check_keep_best(t)


def _check_keep_best(t) -> None:
    """keep_best ranks checkpoints by the held-out loss of an evaluation on a checkpoint step.

    Runs without periodic evaluation (eval_every=0, or shorter than eval_every) have nothing
    to rank and are allowed (the latest checkpoints are kept); a run that evaluates, but
    never on a checkpoint step (the final step is always one), is a config mistake.
    """
    if not t.get("keep_best") or not t.eval_every or t.steps < t.eval_every:
        return
    lands = math.lcm(t.eval_every, t.checkpoint_every) <= t.steps or t.steps % t.eval_every == 0
    if not lands:
        raise ValueError(
            f"config.train.keep_best={t.keep_best} needs an evaluation on a checkpoint step, "
            f"but eval_every={t.eval_every} never lands on one of checkpoint_every="
            f"{t.checkpoint_every} within steps={t.steps}; make eval_every a multiple of "
            "checkpoint_every or set keep_best=0"
        )


def check_stateful(config, data_parallel: int = 1) -> None:
    """Stateful training (`train.carry_state`) needs a model with a carry, the 'streams' window
    layout, and its streams (one per batch row) split evenly over micro-batches and devices."""
    t = config.train
    if not t.get("carry_state", False):
        return
    family = config.model.get("family", "gpn")
    if family == "transformer":
        raise ValueError(
            "config.train.carry_state=true needs a recurrent model (family gpn or gdn); the "
            "transformer carries no state across windows"
        )
    layout = config.data.get("train_layout", "")
    if layout and layout != "streams":
        raise ValueError(
            "config.train.carry_state=true reads one contiguous stream per batch row: "
            f"config.data.train_layout must be 'streams' (or '' for automatic), got {layout!r}"
        )
    split = t.grad_accum * data_parallel
    if t.batch_size % split:
        raise ValueError(
            f"config.train.carry_state=true: the {t.batch_size} streams (one per batch row, "
            f"config.train.batch_size) must split evenly over grad_accum x data-parallel "
            f"devices = {t.grad_accum} x {data_parallel}"
        )


def check_data(data_cfg) -> None:
    f = data_cfg.heldout_fraction
    if not 0 <= f < 1:
        raise ValueError(f"config.data.heldout_fraction must be in [0, 1), got {f}")


def check_config(config, data_parallel: int = 1) -> None:
    """All of the above; raises a one-line ValueError on the first bad field."""
    check_model(config.model)
    check_stateful(config, data_parallel)
    check_train(config.train, data_parallel)
    check_data(config.data)
