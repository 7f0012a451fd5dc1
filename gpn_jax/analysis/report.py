"""`report.md`: the analysis numbers and figures of one run, in the order of the paper."""


def _f(x, fmt=".4g") -> str:
    if x is None:
        return "—"
    return format(x, fmt) if isinstance(x, int | float) else str(x)


def _tok(t: str) -> str:
    return (
        "`"
        + repr(t.replace("▁", " ").replace(" ", "␣"))[1:-1].replace("`", "'").replace("|", "\\|")
        + "`"
    )


def ablation_table(rows: dict) -> str:
    lines = [
        "| ablation | held-out loss | PPL | Δ loss | PPL ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for v in rows.values():
        lines.append(
            f"| {v['label']} | {v['loss']:.4f} | {v['ppl']:.3f} | {v.get('delta_loss', 0):+.4f} "
            f"| {v.get('ppl_ratio', 1):.3f} |"
        )
    return "\n".join(lines)


def _header(run: dict, data: dict) -> list[str]:
    return [
        f"# GPN analysis — {run['workdir']} (step {run['step']})",
        "",
        f"Model: {run['model']}. Held-out data: {data['tokens']:,} tokens in {data['sequences']} "
        f"windows of {data['seq_len']} ({data['batches']} batches), each window from a fresh state, "
        f"from the run's own held-out split ({data['source']}). All numbers are on the predicted "
        "state s^p (before grounding). Every number is also in `metrics.json`.",
        "",
    ]


def _geometry(g: dict, figures: dict) -> list[str]:
    return [
        "## State geometry",
        "",
        f"![geometry]({figures.get('geometry', 'geometry.png')})",
        "",
        "| quantity | value |",
        "|---|---:|",
        f"| ‖s^p‖ mean ± std | {_f(g['norm_mean'])} ± {_f(g['norm_std'])} |",
        f"| per-dim std min / median / max | {_f(g['std_min'])} / {_f(g['std_median'])} / {_f(g['std_max'])} |",
        f"| dead dims ({g['dead_rule']}) | {g['dead_dims']} of {g['dim']} |",
        f"| mean \\|off-diagonal correlation\\| | {_f(g['mean_abs_offdiag_corr'])} |",
        f"| PCA components for 90 % / 99 % variance | {g['pca_90']} / {g['pca_99']} |",
        f"| stable rank ‖X‖F²/‖X‖₂² (centred) | {_f(g['stable_rank'])} |",
        f"| participation ratio (Σλ)²/Σλ² (centred) | {_f(g['participation_ratio'])} |",
        f"| stable rank / participation ratio, uncentred | {_f(g['stable_rank_uncentred'])} / "
        f"{_f(g['participation_ratio_uncentred'])} |",
        "",
        "Spectra are those of the covariance of the **centred** states (X minus its mean over all "
        "held-out tokens); the uncentred row uses E[s sᵀ] instead, which adds s̄ s̄ᵀ to the "
        "spectrum.",
        "",
    ]


def _mean_direction_table(md: dict, data: dict, figures: dict) -> list[str]:
    out = [
        "## Mean direction s̄ = E_t[s^p_t]",
        "",
        f"![mean direction]({figures.get('mean_direction', 'mean_direction.png')})",
        "",
        "| quantity | value |",
        "|---|---:|",
        f"| ‖s̄‖ / E‖s^p‖ | {_f(md['norm_ratio'])} |",
        f"| ‖s̄‖² / E‖s^p‖² (share of state energy in the mean) | {_f(md['mean_energy_share'])} |",
        f"| E_t cos(s^p_t, s̄) | {_f(md['mean_cos_to_state'])} |",
    ]
    if q := md.get("sample_cos_to_mean_quantiles"):
        out.append(
            f"| cos(s^p_t, s̄) 5 % / 50 % / 95 % quantiles ({data['sample_rows']:,} sampled states) "
            f"| {_f(q['0.05'])} / {_f(q['0.5'])} / {_f(q['0.95'])} |"
        )
    if "batch_cos_mean" in md:
        out.append(
            f"| cosine between per-batch means: mean / min ({md['batch_cos_batches']} batches) "
            f"| {_f(md['batch_cos_mean'])} / {_f(md['batch_cos_min'])} |"
        )
    if "spearman_unigram" in md:
        out += [
            f"| Spearman(logits of s̄, training unigram) | {_f(md['spearman_unigram'])} |",
            f"| Spearman(logits of mean embedding, training unigram) | "
            f"{_f(md['mean_embedding_spearman_unigram'])} |",
        ]
    return out + [
        f"| Spearman(logits of s̄, logits of mean embedding) | "
        f"{_f(md['spearman_logits_vs_mean_embedding_logits'])} |",
        f"| running-mean cos to s̄ at token 10 / 100 | {_f(md.get('convergence_cos_at_10'))} / "
        f"{_f(md.get('convergence_cos_at_100'))} |",
        "",
    ]


def _top_tokens(md: dict) -> list[str]:
    unigram = "unigram_top_tokens" in md
    out = [
        "Top tokens (s̄ through the head: logits = (norm_d(s̄) Wdec) Embᵀ; mean embedding ē: "
        "logits = Emb ē):",
        "",
        "| rank | s̄ | p | mean embedding | logit z |" + (" training unigram |" if unigram else ""),
        "|---:|---|---:|---|---:|" + ("---|" if unigram else ""),
    ]
    for i, (a, b) in enumerate(zip(md["top_tokens"], md["mean_embedding_top_tokens"], strict=True)):
        row = f"| {i + 1} | {_tok(a['token'])} | {a['prob']:.3f} | {_tok(b['token'])} | {b['logit_z']:.2f} |"
        if unigram:
            row += f" {_tok(md['unigram_top_tokens'][i]['token'])} |"
        out.append(row)
    conv = ", ".join(f"{k}: {v:.3f}" for k, v in md["convergence"].items())
    return out + [
        "",
        f"Running-mean convergence (per sequence, cos of the mean of its first n predicted states "
        f"with s̄, averaged over sequences): {conv}.",
        "",
    ]


def _state_horizon(sh: dict, figures: dict) -> list[str]:
    return [
        "## Horizons",
        "",
        f"![horizons]({figures.get('horizons', 'horizons.png')})",
        "",
        "State horizon E_t cos(s^p_t, s^p_{t+k}) (centred: each sequence's window mean removed):",
        "",
        "| k | " + " | ".join(str(k) for k in sh["lags"]) + " |",
        "|---|" + "---:|" * len(sh["lags"]),
        "| raw | " + " | ".join(f"{c:.3f}" for c in sh["cos_raw"]) + " |",
        "| centred | " + " | ".join(f"{c:.3f}" for c in sh["cos_centred"]) + " |",
        "",
    ]


def _memory_horizon(mh: dict | None) -> list[str]:
    if not mh:
        return ["This model has no matrix memory: no memory horizon.", ""]
    fast = set(mh["pools"]["fast"])
    out = [
        "Memory horizon: R_h(k) = E_t Π_{τ=t+1..t+k} exp(g_τ,h). 1/e lag: "
        + mh["interpolation"]
        + ".",
        f"Fast pool (1/e lag ≤ {mh['pools']['fast_max_lag']:g}): {mh['n_fast']} heads "
        f"{sorted(fast)}; slow pool: {mh['n_slow']} heads {mh['pools']['slow']}.",
        "",
        "| head | 1/e lag | pool | E[g] | E[exp g] |",
        "|---:|---:|---|---:|---:|",
    ]
    for h, k in enumerate(mh["lag_1e"]):
        lag = f"{k:.3g}" if k is not None else f"> {mh['max_lag']}"
        out.append(
            f"| {h} | {lag} | {'fast' if h in fast else 'slow'} | {mh['mean_log_decay'][h]:.4g} "
            f"| {mh['mean_decay'][h]:.4g} |"
        )
    return out + [""]


def _ablations(ab: dict | None, figures: dict) -> list[str]:
    if not ab:
        return []
    out = [
        "## Causal ablations (not in the paper)",
        "",
        f"Held-out PPL over {ab['tokens']:,} tokens. (b) projects the unit vector s̄/‖s̄‖ "
        "(estimated on the same held-out data) out of the predicted state of every token "
        "before both decoding and grounding; (b') does the same with a random unit vector. "
        "Head ablations zero those heads' read o_h in every layer before the read's output "
        "RMSNorm (which normalises over all heads together, so the surviving heads are "
        "rescaled, as the model's own `Intervention.head_mask` defines it); (e) zeroes the "
        "whole read term of every layer. Rows for an empty pool are omitted.",
        "",
        ablation_table(ab["rows"]),
        "",
    ]
    if "ablations" in figures:
        out += [f"![ablations]({figures['ablations']})", ""]
    return out


def render(results: dict, figures: dict) -> str:
    """The report, one section per analysis, in the paper's order."""
    r, md = results, results["mean_direction"]
    out = (
        _header(r["run"], r["data"])
        + _geometry(r["state_geometry"], figures)
        + _mean_direction_table(md, r["data"], figures)
        + _top_tokens(md)
        + _state_horizon(r["state_horizon"], figures)
        + _memory_horizon(r.get("memory_horizon"))
        + _ablations(r.get("ablations"), figures)
    )
    return "\n".join(out)
