"""The paper's analysis figures as PNG files (matplotlib, Agg backend; no display needed)."""

import os

import numpy as np

FAST_COLOR, SLOW_COLOR = "tab:red", "tab:blue"


def _figure(nrows: int, ncols: int, figsize):
    """A pyplot-free Figure (Agg canvas): no global backend switch, nothing shown in notebooks."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def _save(fig, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def _label(token: str) -> str:
    """A token piece made visible: SentencePiece's '▁' (a space) as '␣', newlines as '\\n'."""
    return repr(token.replace("▁", " ").replace(" ", "␣"))[1:-1] or "''"


def geometry_figure(geom: dict, cov: np.ndarray, path: str, n_dims: int = 64, seed: int = 0) -> str:
    """Sorted per-dimension std; correlation heat-map of a random sample of live dims; PCA."""
    std, lam = geom["_std"], geom["_eigenvalues"]
    fig, ax = _figure(1, 3, (15, 4.2))
    ax = ax[0]
    s = np.sort(std)[::-1]
    ax[0].semilogy(np.arange(1, len(s) + 1), np.maximum(s, 1e-12))
    ax[0].axhline(1e-3 * s.max(), color="gray", ls=":", label="dead threshold")
    ax[0].set(xlabel="dimension (sorted)", ylabel="std of s^p", title="per-dimension std")
    ax[0].legend(fontsize=8)
    alive = np.flatnonzero(std > 1e-3 * std.max())
    rng = np.random.default_rng(seed)
    dims = np.sort(rng.choice(alive, min(n_dims, len(alive)), replace=False))
    sd = std[dims]
    corr = np.clip(cov[np.ix_(dims, dims)] / np.outer(sd, sd), -1, 1)
    im = ax[1].imshow(corr, cmap="RdBu_r", vmin=-1, vmax=1)
    fig.colorbar(im, ax=ax[1], fraction=0.046)
    ax[1].set(
        title=f"correlation, {len(dims)} random dims\nmean |off-diag| (all dims) "
        f"{geom['mean_abs_offdiag_corr']:.3f}",
        xlabel="dim (sample)",
        ylabel="dim (sample)",
    )
    cum = np.cumsum(lam) / max(lam.sum(), 1e-300)
    ax[2].semilogx(np.arange(1, len(cum) + 1), cum)
    for q, k in ((0.9, geom["pca_90"]), (0.99, geom["pca_99"])):
        ax[2].axhline(q, color="gray", ls=":")
        ax[2].axvline(k, color="gray", ls=":")
        ax[2].annotate(
            f"{q:.0%}: {k}", (k, q), textcoords="offset points", xytext=(4, -12), fontsize=8
        )
    ax[2].set(
        xlabel="principal components",
        ylabel="cumulative variance",
        title=f"PCA (centred); stable rank {geom['stable_rank']:.1f}, PR {geom['participation_ratio']:.1f}",
        ylim=(0, 1.02),
    )
    return _save(fig, path)


def horizons_figure(state: dict, memory: dict | None, path: str) -> str:
    """State cosine vs lag (raw, centred); per-head retention with 1/e markers coloured by pool."""
    n = 2 if memory else 1
    fig, ax = _figure(1, n, (6.5 * n, 4.2))
    ax = ax[0]
    ax[0].semilogx(state["lags"], state["cos_raw"], "o-", ms=3, label="raw")
    ax[0].semilogx(state["lags"], state["cos_centred"], "s-", ms=3, label="per-sequence centred")
    ax[0].axhline(0, color="gray", lw=0.5)
    ax[0].set(xlabel="lag k (tokens)", ylabel="E cos(s^p_t, s^p_t+k)", title="state horizon")
    ax[0].legend(fontsize=8)
    if memory:
        lags = np.asarray(memory["lags"])
        fast = set(memory["pools"]["fast"])
        for h, (r, k1e) in enumerate(zip(memory["retention"], memory["lag_1e"], strict=True)):
            color = FAST_COLOR if h in fast else SLOW_COLOR
            ax[1].semilogx(lags, r, color=color, lw=1, alpha=0.8)
            if k1e is not None:
                ax[1].plot([k1e], [np.exp(-1)], "o", color=color, ms=5)
        ax[1].axhline(np.exp(-1), color="gray", ls=":", label="1/e")
        ax[1].plot(
            [], [], color=FAST_COLOR, label=f"fast pool ({memory['n_fast']} heads, 1/e lag ≤ 3)"
        )
        ax[1].plot([], [], color=SLOW_COLOR, label=f"slow pool ({memory['n_slow']} heads)")
        ax[1].set(
            xlabel="lag k (tokens)",
            ylabel="R_h(k)",
            title="memory retention per head (dots: 1/e lag)",
            ylim=(-0.02, 1.02),
        )
        ax[1].legend(fontsize=8)
    return _save(fig, path)


def mean_direction_figure(md: dict, path: str) -> str:
    """Bar charts of s-bar's decoded top tokens and of the mean embedding's; convergence."""
    fig, ax = _figure(1, 3, (16, 4.2))
    ax = ax[0]
    sp = md.get("spearman_unigram")
    rows = md["top_tokens"]
    probs = [max(r["prob"], 1e-12) for r in rows]
    ax[0].barh(range(len(rows))[::-1], probs, color="tab:purple")
    ax[0].set_yticks(range(len(rows))[::-1], [_label(r["token"]) for r in rows])
    ax[0].set_xscale("log")
    for i, p in enumerate(probs):
        ax[0].text(p, len(rows) - 1 - i, f" {p:.3g}", va="center", fontsize=7)
    ax[0].set(
        xlabel="probability (softmax of the head's logits at s̄; log scale)",
        title="s̄ decoded: top tokens"
        + (f" (Spearman vs unigram {sp:.2f})" if sp is not None else ""),
    )
    # the mean embedding has no natural scale through Emb^T: show its logits as z-scores
    rows = md["mean_embedding_top_tokens"]
    lz = [r["logit_z"] for r in rows]
    ax[1].barh(range(len(rows))[::-1], lz, color="tab:gray")
    ax[1].set_yticks(range(len(rows))[::-1], [_label(r["token"]) for r in rows])
    sp = md.get("mean_embedding_spearman_unigram")
    ax[1].set(
        xlabel="logit z-score over the vocabulary (Emb ē)",
        title="mean embedding decoded (contrast)"
        + (f" (Spearman vs unigram {sp:.2f})" if sp is not None else ""),
    )
    conv = md["convergence"]
    ks = [int(k) for k in conv]
    ax[2].semilogx(ks, list(conv.values()), "o-")
    # label every point but one crowding its predecessor (e.g. T = 128 next to 100)
    ax[2].set_xticks(
        ks, [str(k) if i == 0 or k >= 1.5 * ks[i - 1] else "" for i, k in enumerate(ks)]
    )
    ax[2].minorticks_off()
    ax[2].set(
        xlabel="tokens n into the sequence",
        ylabel="cos(running mean, s̄)",
        title="running-mean convergence",
        ylim=(min([0.0, *conv.values()]), 1.02),
    )
    return _save(fig, path)


def ablations_figure(ab: dict, path: str) -> str:
    rows = list(ab["rows"].items())
    fig, ax = _figure(1, 1, (7.5, 0.45 * len(rows) + 1.2))
    ax = ax[0, 0]
    ppl = [v["ppl"] for _, v in rows]
    ax.barh(range(len(rows))[::-1], ppl, color=["tab:green"] + ["tab:orange"] * (len(rows) - 1))
    ax.set_yticks(range(len(rows))[::-1], [v["label"] for _, v in rows])
    ax.set_xscale("log")
    for i, p in enumerate(ppl):
        ax.text(p, len(rows) - 1 - i, f" {p:.2f}", va="center", fontsize=8)
    ax.set(xlabel="held-out PPL (log scale)", title="causal ablations")
    return _save(fig, path)


def write_all(
    results: dict, cov: np.ndarray, out: str, heatmap_dims: int = 64, seed: int = 0
) -> dict:
    """Writes every figure into `out`; returns name -> file name."""
    files = {
        "geometry": geometry_figure(
            results["state_geometry"], cov, os.path.join(out, "geometry.png"), heatmap_dims, seed
        ),
        "horizons": horizons_figure(
            results["state_horizon"],
            results.get("memory_horizon"),
            os.path.join(out, "horizons.png"),
        ),
        "mean_direction": mean_direction_figure(
            results["mean_direction"], os.path.join(out, "mean_direction.png")
        ),
    }
    if results.get("ablations"):
        files["ablations"] = ablations_figure(
            results["ablations"], os.path.join(out, "ablations.png")
        )
    return {k: os.path.basename(v) for k, v in files.items()}
