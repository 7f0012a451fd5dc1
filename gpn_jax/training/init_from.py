"""Starting a run from another trainer's checkpoint: `--config.train.init_from=paper:<ckpt.pkl>`.

`paper:` continues a run of the paper's public trainer from its `checkpoint.pkl` (or the
directory holding it): parameters, optimiser state and step are taken over, so the next
step is the one its optimiser would take. Its optimiser is ours (`training.optimizer`:
clip_by_global_norm, then AdamW with the matrices-only decay mask and the warm-up + cosine
schedule); the LR schedule is not in the pickle, so give the run the paper run's
`learning_rate`, `warmup_steps`, `steps`, `min_lr_ratio`, `b1`, `b2`, `weight_decay` and
`grad_clip`.

Data: the paper trainer reads `data_*.bin` windows of `seq_len` tokens in order, a
micro-batch of `batch_size / grad_accum` windows at a time (its `batch_size` is our
micro-batch), and records the micro-batches consumed as `data_position`. On `bin:` data a
continued run therefore reads its training windows in order (layout 'sequential') and starts
at that position. Other sources have no such position; they are read from their start.

The hand-over happens only in a fresh workdir: once the run has saved a checkpoint, rerunning
the same command resumes from that checkpoint (and says so), as any preempted run does.
"""

import os

import jax
import numpy as np
from absl import logging

from gpn_jax.checkpoints import paper_pickle
from gpn_jax.data.spec import parse_spec
from gpn_jax.training import train_step as ts
from gpn_jax.training.validate import parse_init_from as parse  # the spec: checked before JAX


def note_resumed(config, step: int, directory: str) -> None:
    """Says that the workdir's checkpoint, not `init_from`, is where the run goes on from."""
    if parse(config.train.init_from):
        msg = (
            f"train.init_from={config.train.init_from} is not used: the workdir holds "
            f"checkpoint step {step} ({directory}), and a run resumes from its own checkpoint"
        )
        logging.info(msg)
        print(msg)


def check_found(path: str) -> None:
    """A missing paper checkpoint, reported as `paper_pickle.load` reports it, before a fresh
    run reads its data (a tokenizer trained for nothing) and compiles."""
    pkl = os.path.join(path, "checkpoint.pkl") if os.path.isdir(path) else path
    if not os.path.exists(pkl):
        raise ValueError(f"paper checkpoint not found: {pkl}")


def paper_state(config, abstract: ts.TrainState, shardings) -> tuple[ts.TrainState, int]:
    """(the train state on the mesh, data_position) of the paper checkpoint `init_from` names.

    Raises a one-line ValueError if the checkpoint does not fit the config's model or
    optimiser, or is at or past `train.steps`.
    """
    _, path = parse(config.train.init_from)
    ckpt = paper_pickle.load(path)
    step = ckpt["step"]
    _check_tree(ckpt["params"], abstract.params, path, "parameter")
    _check_optimizer(ckpt["opt_state"], abstract.opt_state, path, step)
    if step >= config.train.steps:
        raise ValueError(
            f"{path} is at step {step}; train.steps ({config.train.steps}) must exceed it"
        )
    rng = jax.random.split(jax.random.PRNGKey(config.seed))[1]  # as `ts.init_train_state`
    host = ts.TrainState(np.int32(step), ckpt["params"], ckpt["opt_state"], np.asarray(rng))
    state = jax.tree.map(_place, host, abstract, shardings)
    msg = (
        f"Starting from paper checkpoint {path}: step {step}, data position {ckpt['data_position']}"
    )
    logging.info(msg)
    print(msg)
    return state, ckpt["data_position"]


def _place(value, like, sharding) -> jax.Array:
    """A host numpy value as a global array (each device takes its shard; any host count)."""
    value = np.asarray(value, like.dtype)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def _name(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def _check_tree(got, want, path: str, what: str) -> None:
    """Same keys, shapes and dtypes as the config's model, or one line naming the first misfit."""
    got_leaves = {_name(p): x for p, x in jax.tree_util.tree_leaves_with_path(got)}
    want_leaves = {_name(p): x for p, x in jax.tree_util.tree_leaves_with_path(want)}
    missing = sorted(set(want_leaves) - set(got_leaves))
    extra = sorted(set(got_leaves) - set(want_leaves))
    if missing or extra:
        raise ValueError(
            f"{path} is of another model than the config's: {what}s missing {missing[:4]}, "
            f"not in the config's model {extra[:4]}"
        )
    for name, like in want_leaves.items():
        x = np.asarray(got_leaves[name])
        if x.shape != like.shape or x.dtype != like.dtype:
            raise ValueError(
                f"{path} is of another model than the config's: {what} {name} is "
                f"{x.dtype}{list(x.shape)}, the config's model has {like.dtype}{list(like.shape)}"
            )


def _check_optimizer(got, want, path: str, step: int) -> None:
    """The paper's optax chain state, in the structure our optimiser builds, counts at `step`."""
    if jax.tree.structure(got) != jax.tree.structure(want):
        raise ValueError(
            f"{path}: its optimiser state {_outline(got)} is not this run's "
            f"(clip_by_global_norm + adamw with a decay mask: {_outline(want)})"
        )
    _check_tree(got, want, path, "optimiser state leaf")
    for p, x in jax.tree_util.tree_leaves_with_path(got):
        if getattr(p[-1], "name", None) == "count" and int(x) != step:
            raise ValueError(f"{path}: optimiser {_name(p)} is {int(x)}, its step is {step}")


def _outline(tree) -> str:
    """A short one-line picture of an optimiser state: its tuples and classes, not its arrays."""
    if isinstance(tree, tuple):
        inner = ", ".join(_outline(x) for x in tree)
        return f"{type(tree).__name__}({inner})" if hasattr(tree, "_fields") else f"({inner})"
    if isinstance(tree, dict):
        return "{params}" if "embed" in tree or "embedding" in tree else f"{{{', '.join(tree)}}}"
    return "array" if hasattr(tree, "shape") else type(tree).__name__


def seek_data(train, data_position: int, config) -> None:
    """Moves the training iterator to the paper run's `data_position` (bin: data only)."""
    if parse_spec(config.data.source).kind != "bin":
        msg = (
            f"the paper run's data position {data_position} counts windows of its bin: "
            f"shards; {config.data.source} is read from its start"
        )
        logging.info(msg)
        print(msg)
        return
    accum = config.train.grad_accum
    if data_position % accum:
        raise ValueError(
            f"paper data_position {data_position} is not a whole number of steps of "
            f"grad_accum {accum} micro-batches"
        )
    index = data_position // accum
    if index >= train.steps_per_epoch:
        raise ValueError(
            f"paper data_position {data_position} is past this run's training split "
            f"({train.steps_per_epoch} steps of {config.train.batch_size} windows); "
            "lower data.heldout_fraction"
        )
    train.set_state(dict(train.get_state(), next_index=index))  # step `index` of epoch 0
