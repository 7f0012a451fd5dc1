"""Analysis statistics on inputs with known answers: spectra, reservoir, retention, 1/e lag, pools.

Everything here runs in float64 (eps 2.2e-16), so the float bounds are float64 eps x the
reduction length x a margin, far below what a wrong formula moves; the tolerances on sampled
quantities (the reservoir's hit rates, a sample correlation) are statistical, stated where used.
"""

import math

import numpy as np
import pytest

from gpn_jax.analysis import horizons, stats


def known_spectrum(lam, n=400, seed=0, mean_scale=3.0):
    """N x d rows whose centred covariance (divided by N) is exactly Q diag(lam) Q^T."""
    rng = np.random.default_rng(seed)
    d = len(lam)
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    a = rng.standard_normal((n, d))
    a -= a.mean(0)  # columns orthogonal to the ones vector: centred
    a, _ = np.linalg.qr(a)  # orthonormal columns, still centred (span is unchanged)
    x = math.sqrt(n) * a @ np.diag(np.sqrt(lam)) @ q.T
    return x + mean_scale * rng.standard_normal(d), q


LAM = np.array([10.0, 5.0, 2.0, 1.0, 1.0, 0.5, 0.0, 0.0])  # sum 19.5


def test_spectral_numbers_of_known_spectrum():
    x, _ = known_spectrum(LAM)
    m = stats.Moments(len(LAM))
    for chunk in np.array_split(x, 7):  # streamed in uneven chunks
        m.add(chunk)
    lam = stats.spectrum(m.covariance)
    # float64 sums over 400 rows then an 8 x 8 eigen-solve: ~400 x 2.2e-16 of the largest
    # eigenvalue (10), x1000 for the solver; absolute because two eigenvalues are exactly 0
    np.testing.assert_allclose(lam, LAM, rtol=0, atol=1e3 * 400 * 2.2e-16 * 10)
    assert stats.stable_rank(lam) == pytest.approx(19.5 / 10)
    assert stats.participation_ratio(lam) == pytest.approx(19.5**2 / (100 + 25 + 4 + 1 + 1 + 0.25))
    # cumulative shares 10, 15, 17, 18, 19, 19.5 / 19.5 = .513 .769 .872 .923 .974 1
    assert stats.pca_components(lam, 0.90) == 4
    assert stats.pca_components(lam, 0.99) == 6
    assert stats.pca_components(lam, 1.0) == 6
    # stable rank is ||X_c||_F^2 / ||X_c||_2^2 of the centred matrix itself
    xc = x - x.mean(0)
    direct = np.linalg.norm(xc, "fro") ** 2 / np.linalg.norm(xc, 2) ** 2
    assert stats.stable_rank(lam) == pytest.approx(direct)
    np.testing.assert_allclose(m.mean, x.mean(0), atol=1e-12)


def test_moments_merge_equals_batch_computation():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((301, 5)) * [1, 2, 3, 4, 5] + 100.0  # large mean: no cancellation
    m = stats.Moments(5)
    for chunk in np.array_split(x, 4):
        m.add(chunk)
    np.testing.assert_allclose(m.covariance, np.cov(x.T, bias=True), rtol=1e-10)
    np.testing.assert_allclose(m.second_moment, x.T @ x / len(x), rtol=1e-10)


def test_extreme_spectra():
    assert stats.participation_ratio(np.ones(7)) == pytest.approx(7)
    assert stats.stable_rank(np.ones(7)) == pytest.approx(7)
    assert stats.stable_rank(np.array([3.0, 0, 0])) == pytest.approx(1)
    assert stats.participation_ratio(np.array([3.0, 0, 0])) == pytest.approx(1)
    assert stats.pca_components(np.array([1.0, 1, 1, 1]), 0.5) == 2


def test_geometry_dead_dims_and_correlation():
    rng = np.random.default_rng(2)
    z = rng.standard_normal((2000, 1))
    x = np.concatenate(
        [z, -z, 2 * z, rng.standard_normal((2000, 1)), np.full((2000, 2), 5.0), 1e-5 * z], axis=1
    )
    m = stats.Moments(x.shape[1])
    m.add(x)
    g = stats.geometry(m)
    assert g["dead_dims"] == 3  # the two constants and the 1e-5 copy (< 1e-3 of the max std 2)
    assert g["std_max"] == pytest.approx(2 * z.std(), rel=1e-9)
    # live dims: z, -z, 2z perfectly (anti)correlated, one independent: 3 pairs at 1, 3 near 0
    # statistical: the 3 near-0 pairs are one sample correlation r of independent columns over
    # 2000 rows (std 1/sqrt(2000) = 0.022); the mean moves by |r|/2, so 0.03 allows 2.7 std
    assert g["mean_abs_offdiag_corr"] == pytest.approx(0.5, abs=0.03)


def test_reservoir_is_a_uniform_sample():
    n, size, trials = 50, 10, 3000
    hits = np.zeros(n)
    for t in range(trials):
        r = stats.Reservoir(size, 1, seed=t)
        rows = np.arange(n, dtype=np.float32)[:, None]
        for chunk in np.array_split(np.arange(n), [3, 4, 20, 27, 45]):  # uneven chunks
            idx, slots = r.offer(len(chunk))
            r.put(slots, rows[chunk][idx])
        s = r.sample[:, 0].astype(int)
        assert len(s) == size and len(set(s)) == size  # distinct rows of the stream
        hits[s] += 1
    # statistical: a hit rate of p = 0.2 over 3000 trials has std sqrt(p(1-p)/3000) = 0.0073;
    # 0.035 is 4.8 std, so 50 slots all pass with probability > 0.9999
    np.testing.assert_allclose(hits / trials, size / n, atol=0.035)


def test_reservoir_keeps_everything_when_stream_is_short():
    r = stats.Reservoir(10, 2)
    idx, slots = r.offer(4)
    r.put(slots, np.arange(8, dtype=np.float32).reshape(4, 2)[idx])
    np.testing.assert_array_equal(r.sample, np.arange(8).reshape(4, 2))


@pytest.mark.parametrize("g", [-2.0, -1.0, -0.5, -1 / 3, -0.1, -0.0125])
def test_one_over_e_lag_of_constant_decay(g):
    T, B = 400, 2
    acc = horizons.RetentionAccumulator(horizons.retention_lags(T - 1), 1)
    acc.add(np.full((T, B, 1), g))
    r = acc.result()
    np.testing.assert_allclose(r["retention"][:, 0], np.exp(g * r["lags"]), rtol=1e-10)
    assert horizons.one_over_e_lag(r["lags"], r["retention"][:, 0]) == pytest.approx(-1 / g)


def test_one_over_e_lag_censored_and_underflow():
    lags = np.arange(1, 11)
    assert horizons.one_over_e_lag(lags, np.exp(-0.01 * lags)) is None
    # R underflows to 0 at once: the crossing still lies in (0, 1]
    k = horizons.one_over_e_lag(lags, np.zeros(10))
    assert 0 < k <= 1


def test_retention_is_the_mean_product_of_decays():
    rng = np.random.default_rng(3)
    T, B, H = 30, 3, 2
    g = -rng.exponential(0.5, (T, B, H))
    acc = horizons.RetentionAccumulator(np.array([1, 2, 5, 29]), H)
    acc.add(g[:, :2])
    acc.add(g[:, 2:])  # two batches
    r = acc.result()
    for i, k in enumerate(r["lags"]):
        want = np.mean(
            [
                np.prod(np.exp(g[t + 1 : t + k + 1, b]), axis=0)
                for t in range(T - k)
                for b in range(B)
            ],
            axis=0,
        )
        np.testing.assert_allclose(r["retention"][i], want, rtol=1e-10)
    np.testing.assert_allclose(r["mean_log_decay"], g.mean((0, 1)))


def test_pool_split_of_synthetic_heads():
    assert horizons.split_pools([0.5, 3.0, 3.01, None, 10.0]) == {
        "fast": [0, 1],
        "slow": [2, 3, 4],
        "fast_max_lag": 3.0,
    }
    # end to end from decays: heads with 1/e lags 0.5, 2, 3, 4 and 50 tokens
    gs = np.array([-2.0, -0.5, -1 / 3, -0.25, -0.02])
    T = 200
    acc = horizons.RetentionAccumulator(horizons.retention_lags(T - 1), len(gs))
    acc.add(np.broadcast_to(gs, (T, 2, len(gs))))
    r = acc.result()
    lags = horizons.one_over_e_lags(r["lags"], r["retention"])
    np.testing.assert_allclose(lags, [0.5, 2, 3, 4, 50])
    pools = horizons.split_pools(lags)
    assert pools["fast"] == [0, 1, 2] and pools["slow"] == [3, 4]


def test_lag_grids():
    assert horizons.log_lags(1).tolist() == [1]
    g = horizons.log_lags(2047, 24)
    assert g[0] == 1 and g[-1] == 2047 and np.all(np.diff(g) > 0)
    r = horizons.retention_lags(2047)
    assert r[:64].tolist() == list(range(1, 65)) and r[-1] == 2047


def test_spearman_matches_scipy_with_ties():
    from scipy.stats import spearmanr

    rng = np.random.default_rng(4)
    a = rng.integers(0, 5, 300).astype(float)  # many ties
    b = a + rng.integers(0, 3, 300)
    assert stats.spearman(a, b) == pytest.approx(spearmanr(a, b).statistic, abs=1e-12)
    np.testing.assert_array_equal(stats.average_ranks([3, 1, 3, 2]), [3.5, 1, 3.5, 2])
    assert stats.spearman(np.ones(5), np.arange(5)) == 0.0
