"""State and memory horizons: lag grids, memory retention, the 1/e lag and the fast/slow pools.

Memory retention of head h at lag k (as the paper defines it): R_h(k) = E_t prod_{tau=t+1}^{t+k} exp(g_{tau,h}),
the factor by which what was written at token t is still present k tokens later. With
D_t = sum_{tau<=t} g_tau (inclusive cumulative sum within a window) the product is
exp(D_{t+k} - D_t); we average it over every (t, sequence) with t + k inside the window,
in float64 on the host (g is tiny next to the states).

1/e lag: the smallest k with R_h(k) <= 1/e. R is measured on a lag grid (every integer up to
`dense` and a log grid beyond); between the last grid lag above 1/e (R(0) = 1) and the first at
or below it, log R is interpolated linearly in k. For a constant decay e^g, log R(k) = g k is
linear, so the interpolation is exact: the lag is -1/g. A head whose retention stays above
1/e up to the largest lag measured is *censored*: its lag is reported as None (> max lag).
"""

import math

import numpy as np

_TINY = np.finfo(np.float64).tiny
FAST_MAX_LAG = 3.0  # the paper's fast pool = heads with 1/e lag <= 3 tokens


def log_lags(max_lag: int, num: int = 24) -> np.ndarray:
    """Unique integer lags 1 .. max_lag spaced evenly in log k."""
    if max_lag < 1:
        return np.zeros(0, np.int64)
    return np.unique(np.round(np.geomspace(1, max_lag, num)).astype(np.int64))


def retention_lags(max_lag: int, dense: int = 64, num_log: int = 24) -> np.ndarray:
    """Every lag 1 .. min(dense, max_lag), then a log grid up to max_lag."""
    if max_lag < 1:
        return np.zeros(0, np.int64)
    lags = np.arange(1, min(dense, max_lag) + 1)
    return np.unique(np.concatenate([lags, log_lags(max_lag, num_log)]))


class RetentionAccumulator:
    """Streams per-head retention sums sum_t exp(D_{t+k} - D_t) and counts for each lag."""

    def __init__(self, lags: np.ndarray, n_heads: int):
        self.lags = np.asarray(lags, np.int64)
        self.sums = np.zeros((len(self.lags), n_heads))
        self.counts = np.zeros(len(self.lags))
        self.g_sum = np.zeros(n_heads)
        self.decay_sum = np.zeros(n_heads)
        self.g_n = 0

    def add(self, g_TxBxH: np.ndarray) -> None:
        """Adds one window batch of log-decays g (T, B, H)."""
        g = np.asarray(g_TxBxH, np.float64)
        T = g.shape[0]
        D = np.cumsum(g, axis=0)
        for i, k in enumerate(self.lags):
            if k >= T:
                continue
            self.sums[i] += np.exp(D[k:] - D[:-k]).sum(axis=(0, 1))
            self.counts[i] += (T - k) * g.shape[1]
        self.g_sum += g.sum(axis=(0, 1))
        self.decay_sum += np.exp(g).sum(axis=(0, 1))
        self.g_n += T * g.shape[1]

    def result(self) -> dict:
        ok = self.counts > 0
        R = self.sums[ok] / self.counts[ok, None]
        return {
            "lags": self.lags[ok],
            "retention": R,  # (K, H)
            "mean_log_decay": self.g_sum / max(self.g_n, 1),
            "mean_decay": self.decay_sum / max(self.g_n, 1),
        }


def one_over_e_lag(lags: np.ndarray, retention: np.ndarray) -> float | None:
    """The 1/e crossing of one head's retention curve (see the module doc); None if censored."""
    target = -1.0
    k_prev, l_prev = 0.0, 0.0  # R(0) = 1
    for k, r in zip(np.asarray(lags, np.float64), np.asarray(retention, np.float64), strict=True):
        lr = math.log(max(r, _TINY))  # an underflowed R(k) = 0 counts as the smallest float
        if lr <= target:
            return k_prev + (target - l_prev) / (lr - l_prev) * (k - k_prev)
        k_prev, l_prev = k, lr
    return None


def one_over_e_lags(lags: np.ndarray, retention_KxH: np.ndarray) -> list[float | None]:
    return [one_over_e_lag(lags, retention_KxH[:, h]) for h in range(retention_KxH.shape[1])]


def split_pools(lags_1e: list[float | None], fast_max: float = FAST_MAX_LAG) -> dict:
    """Fast pool: heads with 1/e lag <= fast_max (+1e-9 for round-off); slow pool: the rest
    (censored heads included)."""
    fast = [h for h, k in enumerate(lags_1e) if k is not None and k <= fast_max + 1e-9]
    slow = [h for h in range(len(lags_1e)) if h not in fast]
    return {"fast": fast, "slow": slow, "fast_max_lag": fast_max}


class StateHorizonAccumulator:
    """Sums of cos(s_t, s_{t+k}) per lag, raw and with each sequence's window mean removed."""

    def __init__(self, lags: np.ndarray):
        self.lags = np.asarray(lags, np.int64)
        self.raw = np.zeros(len(self.lags))
        self.centred = np.zeros(len(self.lags))
        self.raw_n = np.zeros(len(self.lags))
        self.centred_n = np.zeros(len(self.lags))

    def add_sums(self, raw, centred, raw_n, centred_n) -> None:
        """Adds cosine sums per lag and the numbers of (defined) pairs they summed."""
        self.raw += np.asarray(raw, np.float64)
        self.centred += np.asarray(centred, np.float64)
        self.raw_n += np.asarray(raw_n, np.float64)
        self.centred_n += np.asarray(centred_n, np.float64)

    def result(self) -> dict:
        ok = (self.raw_n > 0) & (self.centred_n > 0)
        return {
            "lags": self.lags[ok],
            "cos_raw": self.raw[ok] / self.raw_n[ok],
            "cos_centred": self.centred[ok] / self.centred_n[ok],
            "pairs": self.raw_n[ok],
        }
