"""Trains and scores every (learning rate, seed) run of one cell in one vmapped program.

Runs are stacked along a leading axis R = len(learning_rates) x len(seeds) (run r has rate
r // n_seeds and seed r % n_seeds): parameters, Adam moments and each run's batch carry that
axis, the learning rate is an (R,) array, so one jitted step trains them all and the program
depends only on the family and the window shape (tasks of one length share it).

The model reads only the task's inputs: the window is [inputs, pad] (task ids shifted past the
3 reserved ids), and the logits after reading inputs[0..t] (window position t + 1) are scored
against labels[t] at the answer positions (`hits` / the masked loss). Labels never enter
the window.
"""

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gpn_jax.data.synthetic import Examples
from gpn_jax.models import factory
from gpn_jax.models.base import masked_mean

RESERVED = 3  # model ids 0 (pad), 1 (bos), 2: task id i is model id i + 3
PAD = 0


def model_window(ex: Examples, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(inputs (N, window + 1), labels (N, window), mask (N, window)) in model ids: the task's
    inputs then padding (never scored), one more pad so the last input gets a prediction."""
    n, T = ex.inputs.shape
    if T > window:
        raise ValueError(f"a {T}-token example does not fit the {window}-token window")
    x = np.full((n, window + 1), PAD, np.int32)
    x[:, :T] = ex.inputs + RESERVED
    y = np.zeros((n, window), np.int32)
    y[:, :T] = np.where(ex.mask, ex.labels + RESERVED, 0)
    m = np.zeros((n, window), bool)
    m[:, :T] = ex.mask
    return x, y, m


def hits(pred: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Correct answers per position, summed over the examples (axis -2): predictions equal to
    the label at the answer positions only (`pred` may lead with a runs axis)."""
    return ((np.asarray(pred) == labels) & mask).sum(-2)


def schedule(step: int, steps: int, warmup: int) -> float:
    """Linear warmup then cosine decay to 0 (MAD's cosine schedule)."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1.0 + np.cos(np.pi * (step - warmup) / max(1, steps - warmup)))


class Programs:
    """One family's compiled programs (jit caches one per window shape)."""

    def __init__(self, fields: dict, weight_decay: float, clip: float):
        self.model = model = factory.build_model(fields)
        shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
        decay = model.weight_decay_mask(shapes)
        self.tx = tx = optax.chain(optax.clip_by_global_norm(clip), optax.scale_by_adam())

        def loss(p, x, y, m):
            logits, _ = model.logits(p, x)
            ce = optax.softmax_cross_entropy_with_integer_labels(
                logits[:, 1:].astype(jnp.float32), y
            )
            return masked_mean(ce, m)

        def one(p, s, x, y, m, lr, frac):
            value, g = jax.value_and_grad(loss)(p, x, y, m)
            u, s = tx.update(g, s, p)
            rate = lr * frac
            p = jax.tree.map(lambda w, du, d: w - rate * (du + weight_decay * d * w), p, u, decay)
            return p, s, value

        def predict(p, x):
            logits, _ = model.logits(p, x)
            return jnp.argmax(logits[:, 1:], axis=-1).astype(jnp.int32)

        self.init = jax.jit(jax.vmap(lambda k: (lambda p: (p, tx.init(p)))(model.init(k))))
        self.step = jax.jit(jax.vmap(one, in_axes=(0, 0, 0, 0, 0, 0, None)), donate_argnums=(0, 1))
        self.predict = jax.jit(jax.vmap(predict, in_axes=(0, None)))


@functools.lru_cache(maxsize=8)
def programs(fields_items: tuple, weight_decay: float, clip: float) -> Programs:
    return Programs(dict(fields_items), weight_decay, clip)


def correct_by_position(prog: Programs, params, ex: Examples, window: int, batch: int):
    """((R, T) correct answers of every run per position, (T,) answers per position) on `ex`,
    `batch` examples at a time (answer positions only)."""
    x, y, m = model_window(ex, window)
    n, T = len(x), ex.inputs.shape[1]
    correct = np.zeros((jax.tree.leaves(params)[0].shape[0], T))
    for lo in range(0, n, batch):
        rows = min(batch, n - lo)
        xb = x[lo : lo + batch]
        if rows < batch:  # one compiled shape: fill the last batch with copies, unscored
            xb = np.concatenate([xb, np.repeat(xb[:1], batch - rows, 0)])
        pred = np.asarray(prog.predict(params, xb))[:, :rows, :T]
        yb, mb = y[lo : lo + rows, :T], m[lo : lo + rows, :T]
        correct += hits(pred, yb, mb)
    return correct, m[:, :T].sum(0)


def accuracy(prog: Programs, params, ex: Examples, window: int, batch: int) -> np.ndarray:
    """(R,) accuracy of every run on `ex` (answer positions only), `batch` examples at a time."""
    correct, total = correct_by_position(prog, params, ex, window, batch)
    return correct.sum(1) / max(int(total.sum()), 1)


def train(prog, train_ex: Examples, c, window: int, log=None, evaluate=None) -> tuple:
    """Trains every run of the cell; returns (stacked params, (R,) final losses, first-step s).
    `evaluate(step, params)` runs after every `c.eval_every` steps (when set and > 0)."""
    lrs = np.repeat(np.asarray(c.learning_rates, np.float32), len(c.seeds))
    seeds = np.tile(np.asarray(c.seeds), len(c.learning_rates))
    keys = jnp.stack([jax.random.PRNGKey(int(s)) for s in seeds])
    params, opt = prog.init(keys)
    x, y, m = model_window(train_ex, window)
    orders = {s: np.random.default_rng([c.data_seed, int(s), 7]) for s in c.seeds}
    warmup = max(1, int(c.warmup_frac * c.steps))
    losses, first = None, None
    start = time.time()
    for step in range(c.steps):
        idx = {s: r.integers(0, len(x), c.batch_size) for s, r in orders.items()}
        rows = np.stack([idx[int(s)] for s in seeds])  # (R, B); a seed's runs share batches
        frac = np.float32(schedule(step, c.steps, warmup))
        params, opt, losses = prog.step(params, opt, x[rows], y[rows], m[rows], lrs, frac)
        if first is None:
            jax.block_until_ready(losses)
            first = time.time() - start
        every = c.get("eval_every", 0)
        if evaluate is not None and every and ((step + 1) % every == 0 or step + 1 == c.steps):
            evaluate(step + 1, params)
        if log and (step + 1) % c.log_every == 0:
            log(f"step {step + 1}/{c.steps} loss {np.asarray(losses).mean():.3f}")
    return params, np.asarray(losses), first
