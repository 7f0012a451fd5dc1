"""The paper's qualitative claims, checked on a comparison's GPN / GPN+M runs.

1. GPN+M below GPN in held-out PPL (mean over seeds, and per seed).
2. Fast and slow memory-head pools both present in GPN+M (`gpn_jax.analysis`: heads whose
   1/e retention lag is <= 3 tokens form the fast pool, the others the slow pool).
3. Projecting the mean direction s̄ out of the predicted state hurts held-out PPL more than
   projecting out a random direction (`gpn_jax.analysis.ablations`: rows mean_dir, random_dir).

The numbers come from `gpn_jax.analysis.analyze` (reused, not reimplemented), run once per
finished GPN / GPN+M run into `<workdir>/analysis/<name>[/s<k>]` (the run dirs are only read)
and reused while the run's checkpoint step is unchanged.
"""

import json
import os

from experiments.compare_seeds import mean_std, pm

ANALYSIS_DIR = "analysis"


def analysis_out(workdir: str, run_path: str) -> str:
    return os.path.join(workdir, ANALYSIS_DIR, os.path.relpath(run_path, workdir))


def analyze_run(run_path: str, out: str, max_batches: int) -> dict:
    """`gpn_jax.analysis.analyze` of a finished run (no figures), reused if already done."""
    from gpn_jax.analysis import AnalysisConfig, analyze
    from gpn_jax.checkpoints.restore import load_run

    run = load_run(run_path)
    saved = os.path.join(out, "metrics.json")
    if os.path.exists(saved):
        with open(saved) as f:
            metrics = json.load(f)
        if metrics.get("run", {}).get("step") == int(run.step):
            return metrics
    cfg = AnalysisConfig(max_batches=max_batches, figures=False)
    return analyze(run, out, cfg, log=None)


def is_gpn(row: dict) -> bool:
    return row["family"] == "gpn"


def run_summary(metrics: dict) -> dict:
    """The claim numbers of one analysis: pools and the two direction ablations."""
    mh = metrics.get("memory_horizon") or {}
    rows = (metrics.get("ablations") or {}).get("rows", {})
    out = {
        "n_fast": mh.get("n_fast"),
        "n_slow": mh.get("n_slow"),
        "lag_1e": mh.get("lag_1e"),
    }
    for name in ("base", "mean_dir", "random_dir"):
        if name in rows:
            out[name + "_ppl"] = rows[name]["ppl"]
            out[name + "_ratio"] = rows[name]["ppl_ratio"]
    return out


def analyze_rows(rows: list[dict], workdir: str, max_batches: int) -> None:
    """Adds `analysis` (a `run_summary`) to every run of every GPN / GPN+M row."""
    for row in filter(is_gpn, rows):
        for r in row["runs"]:
            out = analysis_out(workdir, r["workdir"])
            print(f"Analysing {row['label']} seed {r['seed']} -> {out}")
            r["analysis"] = run_summary(analyze_run(r["workdir"], out, max_batches))


def _pick(rows: list[dict], memory: bool) -> dict | None:
    found = [r for r in rows if is_gpn(r) and bool(r["memory_cells"]) == memory]
    return found[0] if found else None


def ppl_claim(rows: list[dict]) -> dict | None:
    m, g = _pick(rows, True), _pick(rows, False)
    if m is None or g is None:
        return None
    per_seed = [
        a["heldout_ppl"] < b["heldout_ppl"] for a, b in zip(m["runs"], g["runs"], strict=True)
    ]
    spread = max(m.get("heldout_ppl_std") or 0.0, g.get("heldout_ppl_std") or 0.0)
    return {
        "holds": m["heldout_ppl"] < g["heldout_ppl"],
        "within_spread": abs(m["heldout_ppl"] - g["heldout_ppl"]) < spread,
        "gpn_m": [m["heldout_ppl"], m.get("heldout_ppl_std")],
        "gpn": [g["heldout_ppl"], g.get("heldout_ppl_std")],
        "seeds_won": sum(per_seed),
        "seeds": len(per_seed),
    }


def pools_claim(rows: list[dict]) -> dict | None:
    m = _pick(rows, True)
    if m is None or not all("analysis" in r for r in m["runs"]):
        return None
    per = [{"seed": r["seed"]} | {k: r["analysis"][k] for k in ("n_fast", "n_slow", "lag_1e")}
           for r in m["runs"]]  # fmt: skip
    return {"holds": all(p["n_fast"] and p["n_slow"] for p in per), "per_seed": per}


def ablation_claim(row: dict) -> dict | None:
    runs = [r["analysis"] for r in row["runs"] if "mean_dir_ratio" in r.get("analysis", {})]
    if not runs:
        return None
    mean_r = mean_std(a["mean_dir_ratio"] for a in runs)
    rand_r = mean_std(a["random_dir_ratio"] for a in runs)
    return {
        "holds": all(a["mean_dir_ratio"] > a["random_dir_ratio"] for a in runs),
        "mean_dir_ratio": list(mean_r),
        "random_dir_ratio": list(rand_r),
        "seeds": len(runs),
    }


def claims(rows: list[dict]) -> dict:
    """The three claims (None where the comparison lacks the runs or analyses)."""
    return {
        "gpn_m_below_gpn": ppl_claim(rows),
        "head_pools": pools_claim(rows),
        "mean_direction_ablation": {
            r["label"]: ablation_claim(r) for r in rows if is_gpn(r) and "runs" in r
        },
    }


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def markdown(c: dict) -> str:
    lines = ["The paper's qualitative claims (GPN / GPN+M runs; `gpn_jax.analysis`):", ""]
    p = c["gpn_m_below_gpn"]
    if p:
        lines.append(
            f"- GPN+M below GPN in held-out PPL: **{_yes(p['holds'])}** — GPN+M "
            f"{pm(*p['gpn_m'])} vs GPN {pm(*p['gpn'])} (GPN+M lower in {p['seeds_won']} of "
            f"{p['seeds']} seeds"
            + ("; the difference is smaller than a seed std)." if p["within_spread"] else ").")
        )
    pools = c["head_pools"]
    if pools:
        per = "; ".join(
            f"seed {s['seed']}: {s['n_fast']} fast / {s['n_slow']} slow, 1/e lags "
            + ", ".join("censored" if x is None else f"{x:.1f}" for x in s["lag_1e"])
            for s in pools["per_seed"]
        )
        lines.append(
            f"- Fast and slow memory-head pools present in GPN+M: **{_yes(pools['holds'])}** — "
            f"{per} (fast: 1/e retention lag <= 3 tokens)."
        )
    for label, a in c["mean_direction_ablation"].items():
        if a:
            lines.append(
                f"- {label}: projecting out s̄ hurts more than a random direction: "
                f"**{_yes(a['holds'])}** — held-out PPL × {pm(*a['mean_dir_ratio'], '.3f')} "
                f"(s̄) vs × {pm(*a['random_dir_ratio'], '.3f')} (random), over "
                f"{a['seeds']} seed(s)."
            )
    return "\n".join(lines) + "\n"
