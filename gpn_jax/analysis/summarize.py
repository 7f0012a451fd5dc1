"""Turns the streamed sums of `collect` into the paper's analyses (plain dicts of numbers).

Keys starting with '_' hold arrays for the figures; `to_json` drops or lists them.
"""

import math

import jax.numpy as jnp
import numpy as np

from gpn_jax.analysis import horizons, stats
from gpn_jax.analysis.collect import Collected
from gpn_jax.core import gpn
from gpn_jax.core.norms import rms_norm


def state_geometry(col: Collected, dead_rel: float = 1e-3) -> dict:
    n = col.moments.n
    mean_norm = col.norm_sum / n
    var = max(col.norm_sq_sum / n - mean_norm**2, 0.0)
    out = {"norm_mean": mean_norm, "norm_std": math.sqrt(var)}
    out |= stats.geometry(col.moments, dead_rel)
    return out


def _piece(tokenizer, i: int) -> str:
    if tokenizer is None:
        return f"<{i}>"
    return tokenizer.id_to_piece(int(i))


def _top(logits: np.ndarray, k: int, tokenizer) -> list[dict]:
    logits = np.asarray(logits, np.float64)
    z = logits - logits.max()
    prob = np.exp(z) / np.exp(z).sum()
    zs = (logits - logits.mean()) / max(logits.std(), 1e-30)
    ids = np.argsort(-logits, kind="stable")[:k]
    return [
        {
            "id": int(i),
            "token": _piece(tokenizer, i),
            "logit": float(logits[i]),
            "logit_z": float(zs[i]),
            "prob": float(prob[i]),
        }
        for i in ids
    ]


def decode_vector(params, s: np.ndarray) -> np.ndarray:
    """Logits of one state vector through the model's head (float32 params)."""
    return np.asarray(gpn.decode(params, jnp.asarray(s, jnp.float32)[None]))[0]


def head_input(params, s: np.ndarray) -> np.ndarray:
    """norm_d(s) @ Wdec [+ b]: the state mapped into the embedding space the head compares with."""
    dp = params["decode"]
    s = jnp.asarray(s, jnp.float32)
    z = rms_norm(s, dp["norm"]) @ dp["proj"]
    if "bias" in dp:
        z = z + dp["bias"]
    return np.asarray(z)


def mean_direction(
    col: Collected, params, tokenizer=None, unigram_counts=None, top_k: int = 10
) -> dict:
    """s-bar = E_t[s^p_t]: size, stability, what it decodes to, and how fast it is reached.

    * norm_ratio: ||s-bar|| / E||s^p||; mean_energy_share: ||s-bar||^2 / E||s^p||^2;
      mean_cos_to_state: E_t cos(s^p_t, s-bar).
    * batch_cos_*: cosines between the means of different held-out batches.
    * decoded top-k tokens of s-bar and Spearman(logits(s-bar), training unigram counts) over the
      whole vocabulary; the same for the mean embedding row e-bar decoded through the tied output
      embedding (logits = Emb e-bar), the contrast (is the unigram ranking s-bar's or the
      embedding's?).
    * convergence: per sequence, cos(mean of s^p over its first n tokens, s-bar), averaged
      (n = 1 is absent when s^p_0 = 0: its cosine is undefined).

    s-bar itself averages every position, s^p_0 = 0 included; cosines skip zero states.
    """
    sbar = col.moments.mean
    sn = float(np.linalg.norm(sbar))
    out = _size_and_stability(col, sbar, sn)
    logits = decode_vector(params, sbar)
    out |= _decoded(params, logits, sbar, tokenizer, unigram_counts, top_k)
    out["convergence"] = {
        int(k): float(v @ sbar / (c * sn))
        for k, v, c in zip(
            col.convergence_points, col.convergence_dir_sum, col.convergence_n, strict=True
        )
        if c > 0 and sn > 0
    }
    for k in (10, 100):
        if k in out["convergence"]:
            out[f"convergence_cos_at_{k}"] = out["convergence"][k]
    out["_logits"] = logits
    out["_direction"] = sbar / sn if sn > 0 else sbar
    return out


def _size_and_stability(col: Collected, sbar, sn: float) -> dict:
    n = col.moments.n
    out = {
        "norm": sn,
        "norm_ratio": sn / (col.norm_sum / n),
        "mean_energy_share": sn**2 / (col.norm_sq_sum / n),
        "mean_cos_to_state": float(col.unit_sum @ sbar / (col.nonzero * sn)) if sn > 0 else 0.0,
        "zero_states": int(n - col.nonzero),
    }
    if len(col.batch_means) >= 2:
        pc = stats.pairwise_cosines(np.stack(col.batch_means))
        out |= {
            "batch_cos_mean": float(pc.mean()),
            "batch_cos_min": float(pc.min()),
            "batch_cos_batches": len(col.batch_means),
        }
    return out


def _decoded(params, logits, sbar, tokenizer, unigram_counts, top_k: int) -> dict:
    """What s-bar and the mean embedding decode to, and their Spearman with the unigram."""
    emb = np.asarray(params["embed"], np.float64)
    ebar = emb.mean(0)
    logits_e = emb @ ebar
    out = {
        "top_tokens": _top(logits, top_k, tokenizer),
        "mean_embedding_top_tokens": _top(logits_e, top_k, tokenizer),
        "head_input_cos_mean_embedding": stats.cosine(head_input(params, sbar), ebar),
        "spearman_logits_vs_mean_embedding_logits": stats.spearman(logits, logits_e),
    }
    if unigram_counts is not None:
        counts = np.asarray(unigram_counts, np.float64)
        out["spearman_unigram"] = stats.spearman(logits, counts)
        out["mean_embedding_spearman_unigram"] = stats.spearman(logits_e, counts)
        out["unigram_top_tokens"] = [
            {"id": int(i), "token": _piece(tokenizer, i), "count": int(counts[i])}
            for i in np.argsort(-counts, kind="stable")[:top_k]
        ]
    return out


def state_horizon(col: Collected) -> dict:
    r = col.state_horizon.result()
    return {
        "lags": r["lags"].tolist(),
        "cos_raw": r["cos_raw"].tolist(),
        "cos_centred": r["cos_centred"].tolist(),
        "centring": "each sequence's mean over its window is removed before the cosine",
    }


def memory_horizon(col: Collected, fast_max: float = horizons.FAST_MAX_LAG) -> dict | None:
    if col.retention is None:
        return None
    r = col.retention.result()
    lags_1e = horizons.one_over_e_lags(r["lags"], r["retention"])
    pools = horizons.split_pools(lags_1e, fast_max)
    return {
        "lags": r["lags"].tolist(),
        "retention": r["retention"].T.tolist(),  # (H, K)
        "lag_1e": lags_1e,
        "max_lag": int(r["lags"].max()),
        "mean_log_decay": r["mean_log_decay"].tolist(),
        "mean_decay": r["mean_decay"].tolist(),
        "pools": pools,
        "n_fast": len(pools["fast"]),
        "n_slow": len(pools["slow"]),
        "interpolation": (
            "log R linear in k between the last lag with R > 1/e (R(0) = 1) and the first with "
            "R <= 1/e; None: R > 1/e up to max_lag"
        ),
    }


def to_json(obj):
    """Drops '_' keys, turns arrays and NumPy scalars into lists and floats (NaN/inf -> None)."""
    if isinstance(obj, dict):
        return {
            str(k): to_json(v)
            for k, v in obj.items()
            if not (isinstance(k, str) and k.startswith("_"))
        }
    if isinstance(obj, list | tuple):
        return [to_json(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_json(obj.tolist())
    if isinstance(obj, np.integer | bool):
        return obj if isinstance(obj, bool) else int(obj)
    if isinstance(obj, float | np.floating):
        f = float(obj)
        return f if math.isfinite(f) else None
    return obj
