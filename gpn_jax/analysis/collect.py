"""One streaming pass over held-out windows: every statistic the analyses need, in bounded memory.

Each (b, T) micro-batch of windows is run from a fresh state (as training scores held-out
windows) by a single jitted function that returns only summaries of the predicted states s^p:
its count, mean and centred scatter matrix (d x d), norm sums, the sum of unit vectors, the
per-lag state-cosine sums, the per-sequence running-mean directions at a few token counts, and
the memory log-decays g (T, b, H), which are small; the host gathers from the device only the
rows its reservoir sampler picks. The host merges them in float64. No (N, d) array over the whole
held-out set ever exists; the largest array is one micro-batch's (T, b, d) states on device.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from gpn_jax.analysis import horizons, stats
from gpn_jax.core import gpn

HIGHEST = jax.lax.Precision.HIGHEST
CONVERGENCE_POINTS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


@dataclasses.dataclass
class Collected:
    """Everything the streaming pass accumulated (host, float64)."""

    moments: stats.Moments
    reservoir: stats.Reservoir
    norm_sum: float
    norm_sq_sum: float
    unit_sum: np.ndarray  # (d,) sum of s^p / ||s^p|| over nonzero states
    batch_means: list  # per held-out batch mean of s^p (the first `max_batch_means` batches)
    state_horizon: horizons.StateHorizonAccumulator
    retention: horizons.RetentionAccumulator | None
    convergence_points: np.ndarray  # token counts n
    convergence_dir_sum: np.ndarray  # (G, d) sum over sequences of unit(mean of s^p_0..n-1)
    convergence_n: np.ndarray  # (G,) sequences whose running mean is nonzero
    nonzero: int  # states with ||s^p|| > 0 (s^p_0 is exactly 0: zero carry, no biases)
    sequences: int
    batches: int
    seq_len: int


def make_micro_stats(model, state_lags, conv_points):
    """Jitted `(params, tokens (b, T)) -> (summaries, g or None, states (T*b, d))`.

    The states stay on the device; the host gathers only its sampled rows from them.
    """
    state_lags = tuple(int(k) for k in state_lags)
    conv_idx = np.asarray(conv_points, np.int64) - 1

    def fn(params, tokens_BxT):
        out, _, _ = model.predicted_states(params, tokens_BxT)
        p = out.p.astype(jnp.float32)  # (T, B, D)
        T, B, D = p.shape
        x = p.reshape(T * B, D)
        mean = x.mean(0)
        xc = x - mean
        norms = jnp.sqrt(jnp.sum(x * x, -1))
        unit = x / jnp.maximum(norms, 1e-30)[:, None]  # a zero state (s^p_0 = 0) stays 0
        # per-sequence running means after n tokens (positions 0 .. n-1), as unit vectors
        rm_dir, rm_ok = _unit(jnp.cumsum(p, axis=0)[conv_idx])  # (G, B, D), (G, B)
        # state horizon: cosines at each lag, raw and with each sequence's window mean removed;
        # a cosine with a zero vector is undefined and left out (s^p_0 = 0 for every sequence)
        u, u_ok = _unit(p)
        uc, uc_ok = _unit(p - p.mean(0, keepdims=True))
        raw = jnp.stack([jnp.sum(u[:-k] * u[k:]) for k in state_lags])
        cen = jnp.stack([jnp.sum(uc[:-k] * uc[k:]) for k in state_lags])
        raw_n = jnp.stack([jnp.sum(u_ok[:-k] * u_ok[k:]) for k in state_lags])
        cen_n = jnp.stack([jnp.sum(uc_ok[:-k] * uc_ok[k:]) for k in state_lags])
        summary = {
            "mean": mean,
            "scatter": jnp.einsum("nd,ne->de", xc, xc, precision=HIGHEST),
            "norm_sum": norms.sum(),
            "norm_sq_sum": jnp.sum(norms * norms),
            "unit_sum": unit.sum(0),
            "nonzero": jnp.sum(norms > 0),
            "conv_dir_sum": rm_dir.sum(1),
            "conv_n": rm_ok.sum(1),
            "horizon_raw": raw,
            "horizon_centred": cen,
            "horizon_raw_n": raw_n,
            "horizon_centred_n": cen_n,
        }
        return summary, out.log_decay, x

    return jax.jit(fn)


def _unit(x):
    """x / ||x|| over the last axis (0 where x = 0) and the float mask of nonzero rows."""
    n = jnp.sqrt(jnp.sum(x * x, -1, keepdims=True))
    return x / jnp.maximum(n, 1e-30), (n[..., 0] > 0).astype(jnp.float32)


def micro_size(batch_size: int, micro_batch: int) -> int:
    """The largest divisor of batch_size not above micro_batch."""
    micro_batch = max(1, min(micro_batch or batch_size, batch_size))
    return max(c for c in range(1, micro_batch + 1) if batch_size % c == 0)


def collect(
    model,
    params,
    windows,
    *,
    max_batches: int = 0,
    micro_batch: int = 16,
    sample_size: int = 4096,
    max_batch_means: int = 256,
    n_state_lags: int = 24,
    seed: int = 0,
) -> Collected:
    """Streams `windows` (an iterable of (B, T) int batches) through the model once.

    Args:
      max_batches: stop after this many batches (0: all).
      micro_batch: windows per device call (bounds device memory: (T, micro_batch, d) states).
      sample_size: rows of s^p kept in the uniform reservoir sample.
      max_batch_means: per-batch means kept for the per-batch cosine.
      n_state_lags: points of the log lag grid of the state horizon.
    """
    col = fn = None
    for bi, batch in enumerate(windows):
        if max_batches and bi >= max_batches:
            break
        batch = np.asarray(batch, np.int32)
        if col is None:
            col, fn = _start(model, params, batch.shape[1], n_state_lags, sample_size, seed)
        elif batch.shape[1] != col.seq_len:
            raise ValueError(f"held-out windows changed length ({col.seq_len} -> {batch.shape[1]})")
        batch_sum = np.zeros(col.unit_sum.shape)
        mb = micro_size(batch.shape[0], micro_batch)
        for r0 in range(0, batch.shape[0], mb):
            batch_sum += _add_micro(col, fn, params, batch[r0 : r0 + mb])
        if len(col.batch_means) < max_batch_means:
            col.batch_means.append(batch_sum / batch.size)
        col.sequences += batch.shape[0]
        col.batches += 1
    if col is None:
        raise ValueError("no held-out windows to analyse")
    return col


def _start(model, params, T: int, n_state_lags: int, sample_size: int, seed: int):
    """(empty `Collected` for windows of T tokens, the jitted micro-batch statistics)."""
    if T < 2:
        raise ValueError(f"analysis needs windows of at least 2 tokens, got {T}")
    D = params["decode"]["norm"].shape[0]
    mem = gpn.memory_shape(params)
    state_lags = horizons.log_lags(T - 1, n_state_lags)
    conv = np.unique([n for n in CONVERGENCE_POINTS if n <= T] + [T])
    ret = None
    if mem is not None:
        ret = horizons.RetentionAccumulator(horizons.retention_lags(T - 1), mem[0])
    col = Collected(
        moments=stats.Moments(D),
        reservoir=stats.Reservoir(sample_size, D, seed),
        norm_sum=0.0,
        norm_sq_sum=0.0,
        unit_sum=np.zeros(D),
        batch_means=[],
        state_horizon=horizons.StateHorizonAccumulator(state_lags),
        retention=ret,
        convergence_points=conv,
        convergence_dir_sum=np.zeros((len(conv), D)),
        convergence_n=np.zeros(len(conv)),
        nonzero=0,
        sequences=0,
        batches=0,
        seq_len=T,
    )
    return col, make_micro_stats(model, state_lags, conv)


def _add_micro(col: Collected, fn, params, tokens: np.ndarray) -> np.ndarray:
    """Runs one micro-batch and merges its summaries into `col`; returns its state sum (d,)."""
    n = tokens.size
    summary, g, x = fn(params, tokens)
    idx, slots = col.reservoir.offer(n)
    if len(idx):
        col.reservoir.put(slots, np.asarray(_gather(x, _padded(idx)))[: len(idx)])
    del x
    summary = jax.device_get(summary)
    col.moments.add_summary(n, summary["mean"], summary["scatter"])
    col.norm_sum += float(summary["norm_sum"])
    col.norm_sq_sum += float(summary["norm_sq_sum"])
    col.unit_sum += summary["unit_sum"]
    col.convergence_dir_sum += summary["conv_dir_sum"]
    col.state_horizon.add_sums(
        summary["horizon_raw"],
        summary["horizon_centred"],
        summary["horizon_raw_n"],
        summary["horizon_centred_n"],
    )
    col.nonzero += int(summary["nonzero"])
    col.convergence_n += summary["conv_n"]
    if col.retention is not None:
        col.retention.add(np.asarray(g))
    return np.asarray(summary["mean"], np.float64) * n


@jax.jit
def _gather(x, idx):
    return x[idx]


def _padded(idx: np.ndarray) -> np.ndarray:
    """idx zero-padded to the next power of two, so the jitted gather compiles a few shapes only."""
    pad = np.zeros(1 << max(len(idx) - 1, 0).bit_length(), np.int32)
    pad[: len(idx)] = idx
    return pad
