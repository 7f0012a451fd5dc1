"""The analysis pass on a tiny GPN+M: streamed statistics against brute force on the full
states, exact causal ablations, outputs of `analyze`, and the CLI on a trained run."""

import json
import math
import os
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from gpn_jax.analysis import ablations, analyses, collect, summarize
from gpn_jax.models.gpn import GPN, GPNConfig
from tests import REPO_ROOT as ROOT
from tests.environment import one_device_env
from tests.tolerance import assert_rel_close, f32_bound

V, B, T = 64, 4, 16
# Float32 bounds (tests/tolerance.py). FORWARD: the model's forward run by another program (other
# fusion, other micro-batches); each state depends on T steps of reductions no longer than
# d_ffn = 32, x2 for the nonlinearities between them. COS: a cosine of two such states (two
# forwards and a d_model = 24 dot); absolute, since a cosine's scale is 1 whatever its value.
FORWARD = f32_bound(T * 32, 2)
COS = 2 * FORWARD + f32_bound(24, 2)


def stats_bound(n_rows: int, margin: float = 2) -> float:
    """A float32 running statistic over `n_rows` forward states vs float64 sums of them."""
    return FORWARD + f32_bound(n_rows, margin)


def ppl_bound(n_tokens: int) -> float:
    """exp of a mean loss: its relative error is the loss's absolute error, at most log(V) x
    the loss's relative error (a forward, then the mean over the tokens after the V-way
    logsumexp)."""
    return math.log(V) * stats_bound(n_tokens + V)


def tiny(memory=True):
    cfg = GPNConfig(
        vocab_size=V,
        d_model=24,
        d_emb=12,
        d_ffn=32,
        n_heads=3 if memory else 0,
        d_key=8 if memory else 0,
        d_value=8 if memory else 0,
        memory=memory,
        loss_chunk=8,
    )
    model = GPN(cfg)
    params = model.init(jax.random.PRNGKey(0))
    # make the parts the analyses look at matter: a non-trivial state, a strong read
    params["ground"]["gate_b"] = params["ground"]["gate_b"] + 1.0
    if memory:
        params["layer_0"]["wo"] = params["layer_0"]["wo"] * 30.0
        # g = -exp(A_log) softplus(b @ wa + dt_bias): two slow heads, one fast
        params["write"]["A_log"] = jnp.zeros(3)
        params["write"]["dt_bias"] = jnp.array([-5.0, -2.0, 5.0])
    return model, params


def windows(n=3, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, V, (B, T), dtype=np.int32) for _ in range(n)]


@pytest.fixture(scope="module")
def gpn_m():
    return tiny(True)


def full_states(model, params, batches, micro_batch=B):
    """Every predicted state and log-decay, computed `micro_batch` rows at a time (as the
    streamed collector does, so both see the same float32 forward pass)."""
    ps, gs = [], []
    for x in batches:
        parts = [
            model.predicted_states(params, jnp.asarray(x[r : r + micro_batch]))[0]
            for r in range(0, len(x), micro_batch)
        ]
        ps.append(np.concatenate([np.asarray(o.p, np.float64) for o in parts], axis=1))  # (T, B, D)
        has_g = parts[0].log_decay is not None
        gs.append(
            np.concatenate([np.asarray(o.log_decay, np.float64) for o in parts], axis=1)
            if has_g
            else None
        )
    return ps, gs


def test_streamed_statistics_match_brute_force(gpn_m):
    model, params = gpn_m
    batches = windows(3)
    col = collect.collect(model, params, batches, micro_batch=2, sample_size=20, n_state_lags=6)
    ps, gs = full_states(model, params, batches, micro_batch=2)
    X = np.concatenate([p.reshape(-1, p.shape[-1]) for p in ps])
    assert col.moments.n == len(X) == 3 * B * T
    # The collector's float32 forward and sums vs float64 sums here, relative to each array's
    # norm (near-zero entries are off by far more, relative, on their own). A wrong statistic
    # is off by O(1e-2) or more.
    n = len(X)
    assert_rel_close(col.moments.mean, X.mean(0), stats_bound(n), "mean")
    # products of two states (x2) and the mean's outer product subtracted (x4 for cancellation)
    cov_bound = 2 * FORWARD + f32_bound(n, 8)
    assert_rel_close(col.moments.covariance, np.cov(X.T, bias=True), cov_bound, "covariance")
    norms = np.linalg.norm(X, axis=1)
    assert col.norm_sum == pytest.approx(norms.sum(), rel=stats_bound(n + 24))
    # s^p_0 comes from the all-zero carry and is exactly zero for every sequence
    assert np.all(np.stack([p[0] for p in ps]) == 0) and col.nonzero == len(X) - 3 * B
    # the sample holds distinct real rows
    sample = col.reservoir.sample
    assert sample.shape == (20, X.shape[1])
    d = np.abs(sample[:, None, :] - X[None].astype(np.float32)).max(-1)
    assert (
        np.all(d.min(1) <= FORWARD * np.abs(X).max()) and len({int(i) for i in d.argmin(1)}) == 20
    )
    # per-batch means
    for m, p in zip(col.batch_means, ps, strict=True):
        assert_rel_close(m, p.reshape(-1, p.shape[-1]).mean(0), stats_bound(B * T), "batch mean")

    # state horizon: mean cosine over all (t, t + k) pairs with both states nonzero
    def cos_pairs(p, k):
        a, b = p[:-k], p[k:]
        na, nb = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)
        ok = (na > 0) & (nb > 0)
        return (np.sum(a * b, -1)[ok] / (na * nb)[ok]).tolist()

    h = summarize.state_horizon(col)
    for i, k in enumerate(h["lags"]):
        raw = sum((cos_pairs(p, k) for p in ps), [])
        cen = sum((cos_pairs(p - p.mean(0, keepdims=True), k) for p in ps), [])
        assert h["cos_raw"][i] == pytest.approx(np.mean(raw), abs=COS)
        # centred: the states minus their mean over the sequence's T steps
        assert h["cos_centred"][i] == pytest.approx(np.mean(cen), abs=COS + f32_bound(T, 4))

    # memory retention from the model's own log-decays
    r = col.retention.result()
    want = [
        np.mean(
            np.concatenate([np.exp(g[t + 1 : t + k + 1].sum(0)) for g in gs for t in range(T - k)]),
            0,
        )
        for k in r["lags"]
    ]
    # Retention spans 1 down to ~1e-22 (strong decays at long lags), where float32 round-off in
    # g, amplified by exp, moves single entries by far more, relative: compare the whole (lags,
    # heads) array relative to its norm instead. exp turns the absolute error of a sum of at
    # most T log-decays (each |g| < 1 where the norm's entries live) into a relative one; x4.
    assert_rel_close(np.asarray(r["retention"]), np.stack(want), f32_bound(T, 4), "retention")

    # running-mean convergence: per sequence cos(mean of s^p_0..n-1, s-bar)
    md = summarize.mean_direction(col, params, None, np.arange(V), top_k=5)
    sbar = X.mean(0)
    for n, c in md["convergence"].items():
        rm = np.concatenate([p[:n].mean(0) for p in ps])  # (3B, D)
        want = rm @ sbar / (np.linalg.norm(rm, axis=1) * np.linalg.norm(sbar))
        assert c == pytest.approx(want.mean(), abs=COS + f32_bound(T, 2))  # a running mean
    assert 1 not in md["convergence"]  # the running mean of s^p_0 = 0 has no direction
    unit = X[norms > 0] / norms[norms > 0, None]
    # a mean cosine (absolute: scale 1) and a ratio of two statistics (relative)
    assert md["mean_cos_to_state"] == pytest.approx(
        (unit @ sbar).mean() / np.linalg.norm(sbar), abs=COS + f32_bound(n, 2)
    )
    assert md["norm_ratio"] == pytest.approx(
        np.linalg.norm(sbar) / norms.mean(), rel=2 * stats_bound(n + 24)
    )


def test_mean_direction_decoding(gpn_m):
    from gpn_jax.core import gpn as core

    model, params = gpn_m
    col = types.SimpleNamespace(  # only s-bar matters for the decoding numbers
        moments=types.SimpleNamespace(n=10, mean=np.linspace(-1, 2, 24)),
        norm_sum=30.0, norm_sq_sum=100.0, unit_sum=np.ones(24), nonzero=10, batch_means=[],
        convergence_points=np.array([1]), convergence_dir_sum=np.ones((1, 24)),
        convergence_n=np.ones(1), sequences=1,
    )  # fmt: skip
    counts = np.random.default_rng(0).integers(0, 100, V)
    md = summarize.mean_direction(col, params, None, counts, top_k=10)
    sbar = col.moments.mean

    want = np.asarray(core.decode(params, jnp.asarray(sbar, jnp.float32)[None]))[0]
    assert [t["id"] for t in md["top_tokens"]] == np.argsort(-want, kind="stable")[:10].tolist()
    from scipy.stats import spearmanr

    # rank statistics of the same logits: equal ranks give the same value up to float64
    # rounding (scale 1, so absolute); a wrong ranking moves it by far more than 1e-6
    assert md["spearman_unigram"] == pytest.approx(spearmanr(want, counts).statistic, abs=1e-6)
    e = np.asarray(params["embed"], np.float64)
    le = e @ e.mean(0)
    assert [t["id"] for t in md["mean_embedding_top_tokens"]] == np.argsort(-le)[:10].tolist()
    assert md["mean_embedding_spearman_unigram"] == pytest.approx(
        spearmanr(le, counts).statistic, abs=1e-6
    )


def plain_ppl(model, params, batches):
    """Independent PPL: the plain model's jitted loss (no intervention), token-weighted, on the
    reference scan the ablations run on (`GPN.autodiff`; the default fused window differs from
    it in the last bits)."""
    model = model.autodiff()
    loss = jax.jit(lambda p, x: model.loss(p, x)[0])
    total = sum(float(loss(params, jnp.asarray(x))) * x.size for x in batches)
    return math.exp(total / sum(x.size for x in batches))


def test_ablations_are_exact(gpn_m):
    model, params = gpn_m
    batches = windows(2, seed=5)
    pools = {"fast": [2], "slow": [0, 1]}
    ivs = ablations.interventions(params, np.ones(24), pools)
    ivs["all_heads"] = ivs["base"]._replace(head_mask=jnp.zeros(3))
    rows = ablations.ablation_ppl(model, params, batches, ivs)["rows"]
    # (a) the identity intervention is bit-identical to the plain model
    assert rows["base"]["ppl"] == plain_ppl(model, params, batches)
    # (e) equals the model with its read output forced to zero: every layer's wo zeroed
    zero_read = jax.tree.map(lambda a: a, params)
    for name in params:
        if name.startswith("layer_"):
            zero_read[name] = dict(params[name], wo=jnp.zeros_like(params[name]["wo"]))
    assert rows["no_read"]["ppl"] == plain_ppl(model, zero_read, batches)
    assert rows["no_read"]["ppl"] != rows["base"]["ppl"]  # the read matters in this model
    # zeroing every head's read (before the output norm) removes the read as well
    assert rows["all_heads"]["ppl"] == rows["no_read"]["ppl"]
    # the two pools are different, real edits
    assert len({rows[k]["ppl"] for k in ("base", "fast_heads", "slow_heads", "no_read")}) == 4
    assert rows["mean_dir"]["ppl"] != rows["base"]["ppl"]
    assert rows["base"]["delta_loss"] == 0 and rows["base"]["ppl_ratio"] == 1


def test_direction_ablation_matches_manual_projection(gpn_m):
    """(b) = decode and ground the predicted state with the direction removed, re-implemented
    here step by step from `core.gpn` pieces."""
    from gpn_jax.core import gpn as core

    model, params = gpn_m
    x = jnp.asarray(windows(1, seed=7)[0])
    u = np.random.default_rng(1).standard_normal(24)
    u = jnp.asarray(u / np.linalg.norm(u), jnp.float32)
    carry = model.init_state(B)
    total = 0.0
    for t in range(T):
        M, out = core.predict(params, carry)
        p = out.p - (out.p @ u)[:, None] * u
        logits = core.decode(params, p)
        total += float(-jnp.take_along_axis(jax.nn.log_softmax(logits), x[:, t, None], 1).sum())
        s_new = core.ground(params["ground"], p, core.grounding_inputs(params, x[:, t]))
        carry = core.GPNCarry(s_new, carry.s, M)
    ivs = {"d": ablations.identity(24, 3)._replace(direction=u)}
    rows = ablations.ablation_ppl(model, params, [np.asarray(x)], ivs)["rows"]
    assert rows["d"]["loss"] == pytest.approx(total / x.size, rel=stats_bound(x.size + V))


class FakeData:
    def __init__(self, batches, counts):
        self.batches, self.unigram_counts, self.tokenizer = batches, counts, None

    def heldout_windows(self, batch_size=None, seq_len=None):
        return iter(self.batches)


def fake_run(model, params):
    config = ml_collections.ConfigDict(
        {"data": {"source": "synthetic"}, "model": {"family": "gpn"}}
    )
    return types.SimpleNamespace(
        model=model, params=params, config=config, workdir="/fake", step=7, tokenizer=None
    )


REQUIRED = {
    "state_geometry": [
        "norm_mean", "norm_std", "std_min", "std_max", "dead_dims", "mean_abs_offdiag_corr",
        "pca_90", "pca_99", "stable_rank", "participation_ratio",
    ],
    "mean_direction": [
        "norm_ratio", "batch_cos_mean", "top_tokens", "spearman_unigram",
        "mean_embedding_top_tokens", "mean_embedding_spearman_unigram", "convergence",
        "convergence_cos_at_10",
    ],
    "state_horizon": ["lags", "cos_raw", "cos_centred"],
    "memory_horizon": ["lags", "retention", "lag_1e", "pools", "n_fast", "n_slow"],
}  # fmt: skip


def test_analyze_writes_every_output(gpn_m, tmp_path):
    model, params = gpn_m
    data = FakeData(windows(3), np.arange(V))
    cfg = analyses.AnalysisConfig(micro_batch=2, sample_size=16, heatmap_dims=8)
    res = analyses.analyze(fake_run(model, params), str(tmp_path), cfg, data=data, log=None)
    files = sorted(os.listdir(tmp_path))
    assert files == sorted(
        [
            "metrics.json",
            "report.md",
            "geometry.png",
            "horizons.png",
            "mean_direction.png",
            "ablations.png",
        ]
    )
    with open(tmp_path / "metrics.json") as f:
        saved = json.load(f)
    for section, keys in REQUIRED.items():
        assert all(k in saved[section] for k in keys), (section, set(keys) - set(saved[section]))
    assert saved["memory_horizon"]["pools"] == {"fast": [2], "slow": [0, 1], "fast_max_lag": 3.0}
    assert set(saved["ablations"]["rows"]) == {
        "base", "mean_dir", "random_dir", "fast_heads", "slow_heads", "no_read"
    }  # fmt: skip
    n_tokens = sum(np.size(b) for b in data.batches)
    assert saved["ablations"]["rows"]["base"]["ppl"] == pytest.approx(
        plain_ppl(model, params, data.batches), rel=ppl_bound(n_tokens)
    )  # micro-batched (2 windows at a time): equal up to float32 summation order
    assert res["state_geometry"] == saved["state_geometry"]
    report = (tmp_path / "report.md").read_text()
    for needle in (
        "State geometry",
        "Mean direction",
        "Horizons",
        "Causal ablations",
        "geometry.png",
    ):
        assert needle in report
    for png in ("geometry.png", "horizons.png", "mean_direction.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_analyze_gpn_without_memory(tmp_path):
    model, params = tiny(memory=False)
    data = FakeData(windows(2), np.arange(V))
    cfg = analyses.AnalysisConfig(micro_batch=4, sample_size=8, heatmap_dims=8)
    res = analyses.analyze(fake_run(model, params), str(tmp_path), cfg, data=data, log=None)
    assert res["memory_horizon"] is None
    assert set(res["ablations"]["rows"]) == {"base", "mean_dir", "random_dir"}
    assert "no matrix memory" in (tmp_path / "report.md").read_text()


def test_memory_stays_bounded(gpn_m):
    """Nothing the pass keeps grows with the held-out set beyond the configured bounds."""
    model, params = gpn_m
    col = collect.collect(
        model, params, windows(6), micro_batch=1, sample_size=5, max_batch_means=2
    )
    assert col.moments.n == 6 * B * T
    assert col.reservoir.rows.shape == (5, 24) and len(col.batch_means) == 2
    arrays = [v for v in vars(col).values() if isinstance(v, np.ndarray)]
    assert max(a.shape[0] for a in arrays) < 6 * B * T


def test_rejects_other_models():
    run = types.SimpleNamespace(
        model=object(), config=ml_collections.ConfigDict({"model": {"family": "transformer"}})
    )
    with pytest.raises(ValueError, match="GPN / GPN\\+M runs"):
        analyses.check_model(run)


# ---------------------------------------------------------------------------- a real run
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny GPN+M trained for a few steps on the embedded corpus (its own held-out split), by
    the trainer in this process (its command line is tests/entry_points/test_train_cli.py's)."""
    from tests.helpers.training import tiny_config, train_on_one_device

    workdir = str(tmp_path_factory.mktemp("run"))
    train_on_one_device(tiny_config(checkpoint_every=4, final_eval_batches=6), workdir)
    with open(os.path.join(workdir, "final_metrics.json")) as f:
        return workdir, json.load(f)


@pytest.mark.slow
def test_analyze_trained_run_uses_its_heldout_split(trained, tmp_path):
    workdir, final = trained
    from gpn_jax.checkpoints.restore import load_run

    config = analyses.AnalysisConfig(max_batches=6, micro_batch=4)
    res = analyses.analyze(load_run(workdir), str(tmp_path), config)
    # (a) reproduces the held-out PPL training reported over the same six held-out batches
    # the same forward in another batching: gpn_m_tiny (vocab 512, d_ffn 128, windows of 32) over
    # the six held-out batches of 8 windows; exp turns the mean loss's absolute error
    # (<= log 512 x its relative error) into the PPL's relative error
    bound = math.log(512) * (f32_bound(32 * 128, 2) + f32_bound(6 * 8 * 32 + 512, 2))
    assert res["ablations"]["rows"]["base"]["ppl"] == pytest.approx(final["heldout_ppl"], rel=bound)
    assert res["data"]["tokens"] == final["heldout_tokens"]
    top = res["mean_direction"]["top_tokens"]
    assert all(isinstance(t["token"], str) and not t["token"].startswith("<") for t in top[:1])
    assert (tmp_path / "report.md").exists()


def test_cli_one_line_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "gpn_jax.analyze", f"--workdir={tmp_path / 'none'}",
         f"--out={tmp_path / 'an'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env=one_device_env(),
    )  # fmt: skip
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("gpn-analyze: error: no checkpoint"), proc.stderr


@pytest.mark.slow
def test_cli_end_to_end(trained, tmp_path):
    workdir, _ = trained
    out = tmp_path / "an"
    proc = subprocess.run(
        [sys.executable, "-m", "gpn_jax.analyze", f"--workdir={workdir}", f"--out={out}",
         "--max_batches=4", "--sample_size=256"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=one_device_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "(e) whole memory read zeroed" in proc.stdout
    for f in ("metrics.json", "report.md", "geometry.png", "horizons.png", "mean_direction.png"):
        assert (out / f).exists(), f
    other = tmp_path / "other"
    other.mkdir()
    (other / "report.md").write_text("keep me")
    proc = subprocess.run(
        [sys.executable, "-m", "gpn_jax.analyze", f"--workdir={workdir}", f"--out={other}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=one_device_env(),
    )  # fmt: skip
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert "holds no analysis of this run" in lines[0]
    assert (other / "report.md").read_text() == "keep me"


def test_analysis_out_never_replaces_another_directorys_files(tmp_path):
    """A new or empty --out, or one holding an earlier analysis of the same run, is accepted;
    a directory with anything else, or one inside the run's workdir, is refused."""
    from gpn_jax.analysis.analyses import check_analysis_out

    wd = tmp_path / "run"
    wd.mkdir()
    check_analysis_out(str(tmp_path / "new"), str(wd))
    (tmp_path / "empty").mkdir()
    check_analysis_out(str(tmp_path / "empty"), str(wd))
    for name, run in (("same", str(wd)), ("another", str(tmp_path / "x")), ("junk", None)):
        (tmp_path / name).mkdir()
        body = {"run": {"workdir": run, "step": 3}} if run else ["not", "ours"]
        (tmp_path / name / "metrics.json").write_text(json.dumps(body))
    check_analysis_out(str(tmp_path / "same"), str(wd))
    for name in ("another", "junk"):
        with pytest.raises(ValueError, match="non-empty directory that holds no analysis of this"):
            check_analysis_out(str(tmp_path / name), str(wd))
    with pytest.raises(ValueError, match="is inside the run's workdir"):
        check_analysis_out(str(wd / "analysis"), str(wd))
