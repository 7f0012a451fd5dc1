"""Associative recall accuracy: top-1 prediction at the query-answer positions.

A run trained on `recall:` data is scored on its own held-out examples (same parameters,
same seed, same example length). Any other run gets the default task at `4 * pairs` tokens
(or its own window) inside its vocabulary: an in-context recall probe.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gpn_jax.data import recall as recall_data
from gpn_jax.data.spec import parse_spec


def recall_accuracy(model, params, tokens_NxT, mask_NxT, batch_size: int = 64) -> dict:
    """Top-1 accuracy (and CE) at the positions where `mask` is True.

    Returns {'acc', 'answer_ppl', 'answers', 'examples', 'acc_by_query'} where
    `acc_by_query[j]` is the accuracy of the j-th query of every example.
    """
    tokens_NxT, mask_NxT = np.asarray(tokens_NxT, np.int32), np.asarray(mask_NxT, bool)

    score = _scorer(model)
    correct, ce = [], []
    n = len(tokens_NxT)
    for lo in range(0, n, batch_size):
        batch = tokens_NxT[lo : lo + batch_size]
        rows = len(batch)
        if rows < batch_size:  # one compiled shape: fill the last batch with copies
            batch = np.concatenate([batch, np.repeat(batch[:1], batch_size - rows, 0)])
        c, e = jax.device_get(score(params, batch))
        correct.append(c[:rows])
        ce.append(e[:rows])
    correct, ce = np.concatenate(correct), np.concatenate(ce)
    answers = int(mask_NxT.sum())
    if not answers:
        raise ValueError("no query positions to score")
    counts = mask_NxT.sum(1)
    same = (counts == counts[0]).all()  # generated examples: Q answers each
    by_query = correct[mask_NxT].reshape(n, -1).mean(0).round(4).tolist() if same else None
    return {
        "acc": float(correct[mask_NxT].mean()),
        "answer_ppl": math.exp(float(ce[mask_NxT].astype(np.float64).mean())),
        "answers": answers,
        "examples": n,
        "acc_by_query": by_query,
    }


@functools.lru_cache(maxsize=8)
def _scorer(model):
    def score(p, x):
        logits, _ = model.logits(p, x)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), x)
        return jnp.argmax(logits, axis=-1) == x, ce

    return jax.jit(score)


def task_for_run(run):
    """(RecallSpec, seq_len) the run is evaluated on (see the module docstring)."""
    source = parse_spec(run.config.data.source)
    if source.kind == "recall":
        spec = recall_data.parse_recall_params(source.name)
        seq_len = run.config.train.seq_len
    else:
        spec = recall_data.RecallSpec()
        seq_len = 4 * spec.pairs
    vocab = run.config.model.vocab_size
    if spec.vocab_needed > vocab:
        raise ValueError(
            f"the recall task needs vocab_size >= {spec.vocab_needed}, model has {vocab}"
        )
    return spec, seq_len


def recall_eval(run, examples: int | None = None, batch_size: int = 64) -> dict:
    """Recall accuracy of a restored run on held-out examples (`examples`: how many)."""
    spec, seq_len = task_for_run(run)
    tokens, mask = recall_data.heldout_examples(spec, seq_len, examples)
    if not len(tokens):
        raise ValueError("no recall examples to evaluate (heldout=0)")
    result = recall_accuracy(run.model, run.params, tokens, mask, batch_size)
    return result | {
        "task": spec.params(),
        "seq_len": seq_len,
        "chance": 1.0 / spec.values,
    }
