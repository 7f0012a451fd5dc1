"""Streaming statistics and spectral summaries of a set of state vectors (pure NumPy, float64).

Nothing here holds the (N, d) matrix of states: `Moments` keeps the count, the mean and the
centred scatter matrix (d x d), merged batch by batch with Chan et al.'s parallel update, and
`Reservoir` keeps a bounded uniform sample of rows for anything that needs raw states.

Spectral conventions (the paper does not say whether X is centred; we centre and say so):

* the spectrum is that of the covariance C = X_c^T X_c / N of the centred states X_c;
* stable rank      = ||X_c||_F^2 / ||X_c||_2^2 = sum(lambda) / max(lambda);
* participation    = (sum lambda)^2 / sum(lambda^2);
* PCA components   = the fewest leading eigenvalues whose cumulative share reaches q.
"""

import math

import numpy as np


class Moments:
    """Count, mean and centred scatter matrix of d-vectors, accumulated batch by batch."""

    def __init__(self, dim: int):
        self.n = 0
        self.mean = np.zeros(dim)
        self.scatter = np.zeros((dim, dim))

    def add_summary(self, n: int, mean: np.ndarray, scatter: np.ndarray) -> None:
        """Merges a batch given by its count, mean and scatter sum((x - mean)(x - mean)^T)."""
        if n <= 0:
            return
        mean, scatter = np.asarray(mean, np.float64), np.asarray(scatter, np.float64)
        total = self.n + n
        delta = mean - self.mean
        self.scatter += scatter + np.outer(delta, delta) * (self.n * n / total)
        self.mean += delta * (n / total)
        self.n = total

    def add(self, x: np.ndarray) -> None:
        """Merges raw rows x (N, d)."""
        x = np.asarray(x, np.float64)
        m = x.mean(0)
        xc = x - m
        self.add_summary(len(x), m, xc.T @ xc)

    @property
    def covariance(self) -> np.ndarray:
        """Population covariance (divides by N)."""
        return self.scatter / max(self.n, 1)

    @property
    def second_moment(self) -> np.ndarray:
        """E[x x^T] (uncentred)."""
        return self.covariance + np.outer(self.mean, self.mean)


class Reservoir:
    """A uniform random sample of at most `size` rows of a stream (Vitter's algorithm R).

    `offer(n)` says which of the next n rows to keep and where; the caller gathers only those
    rows (so a device array is never copied whole) and hands them to `put`.
    """

    def __init__(self, size: int, dim: int, seed: int = 0):
        self.size, self.seen = size, 0
        self.rows = np.zeros((size, dim), np.float32)
        self.rng = np.random.default_rng(seed)

    def offer(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(indices into the next n rows, slots they go to); later rows overwrite earlier ones."""
        idx = np.arange(n)
        seen = self.seen + idx  # rows already seen before each new row
        fill = seen < self.size
        accept = fill | (self.rng.random(n) < self.size / np.maximum(seen + 1, 1))
        slots = np.where(fill, seen, self.rng.integers(0, max(self.size, 1), n))
        self.seen += n
        idx, slots = idx[accept], slots[accept]
        # keep only the last row written to each slot (order within a batch matters)
        _, last = np.unique(slots[::-1], return_index=True)
        keep = len(slots) - 1 - last
        return idx[keep], slots[keep]

    def put(self, slots: np.ndarray, rows: np.ndarray) -> None:
        self.rows[slots] = rows

    @property
    def sample(self) -> np.ndarray:
        return self.rows[: min(self.seen, self.size)]


def spectrum(cov: np.ndarray) -> np.ndarray:
    """Eigenvalues of a symmetric PSD matrix, descending, negatives (round-off) clipped to 0."""
    lam = np.linalg.eigvalsh(np.asarray(cov, np.float64))[::-1]
    return np.clip(lam, 0.0, None)


def stable_rank(lam: np.ndarray) -> float:
    """||X||_F^2 / ||X||_2^2 from the eigenvalues of X^T X (or any multiple of it)."""
    lam = np.asarray(lam, np.float64)
    return float(lam.sum() / lam.max()) if lam.max() > 0 else 0.0


def participation_ratio(lam: np.ndarray) -> float:
    """(sum lambda)^2 / sum lambda^2."""
    lam = np.asarray(lam, np.float64)
    sq = float(np.sum(lam**2))
    return float(lam.sum() ** 2 / sq) if sq > 0 else 0.0


def pca_components(lam: np.ndarray, q: float) -> int:
    """The fewest leading components whose share of the total variance reaches q (0 < q <= 1)."""
    lam = np.sort(np.asarray(lam, np.float64))[::-1]
    total = lam.sum()
    if total <= 0:
        return 0
    cum = np.cumsum(lam) / total
    return int(np.searchsorted(cum, q - 1e-12) + 1)


def correlation(cov: np.ndarray, alive: np.ndarray | None = None) -> np.ndarray:
    """The correlation matrix of `cov` restricted to `alive` dims (default: std > 0)."""
    std = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    alive = std > 0 if alive is None else alive
    c = cov[np.ix_(alive, alive)] / np.outer(std[alive], std[alive])
    return np.clip(c, -1.0, 1.0)


def mean_abs_offdiag(corr: np.ndarray) -> float:
    n = corr.shape[0]
    if n < 2:
        return 0.0
    return float((np.abs(corr).sum() - np.abs(np.diag(corr)).sum()) / (n * (n - 1)))


def geometry(moments: Moments, dead_rel: float = 1e-3) -> dict:
    """The paper's state-geometry numbers from streamed moments (centred spectrum, see module)."""
    cov = moments.covariance
    std = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    dead = std < dead_rel * std.max() if std.max() > 0 else np.ones_like(std, bool)
    lam = spectrum(cov)
    lam_raw = spectrum(moments.second_moment)
    alive = ~dead
    return {
        "dim": int(len(std)),
        "tokens": int(moments.n),
        "std_min": float(std.min()),
        "std_max": float(std.max()),
        "std_median": float(np.median(std)),
        "dead_dims": int(dead.sum()),
        "dead_rule": f"std < {dead_rel:g} * max std",
        "mean_abs_offdiag_corr": mean_abs_offdiag(correlation(cov, alive)),
        "pca_90": pca_components(lam, 0.90),
        "pca_99": pca_components(lam, 0.99),
        "stable_rank": stable_rank(lam),
        "participation_ratio": participation_ratio(lam),
        "stable_rank_uncentred": stable_rank(lam_raw),
        "participation_ratio_uncentred": participation_ratio(lam_raw),
        "centred": True,
        "_std": std,
        "_eigenvalues": lam,
    }


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of x with ties given their average rank (scipy's 'average' method)."""
    x = np.asarray(x)
    order = np.argsort(x, kind="stable")
    xs = x[order]
    # start index of each run of equal values, and the average 1-based rank of the run
    starts = np.flatnonzero(np.concatenate([[True], xs[1:] != xs[:-1]]))
    ends = np.concatenate([starts[1:], [len(x)]])
    avg = (starts + ends + 1) / 2.0
    ranks = np.empty(len(x))
    ranks[order] = np.repeat(avg, ends - starts)
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation: Pearson correlation of the average ranks (0 if undefined)."""
    ra = average_ranks(np.asarray(a, np.float64))
    rb = average_ranks(np.asarray(b, np.float64))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = math.sqrt(float(ra @ ra) * float(rb @ rb))
    return float(ra @ rb / den) if den > 0 else 0.0


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    den = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / den) if den > 0 else 0.0


def pairwise_cosines(x: np.ndarray) -> np.ndarray:
    """Cosines of all pairs i < j of the rows of x."""
    x = np.asarray(x, np.float64)
    u = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-300)
    c = u @ u.T
    return c[np.triu_indices(len(x), 1)]
