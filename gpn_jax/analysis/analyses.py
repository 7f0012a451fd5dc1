"""`analyze(run, out)`: every analysis the paper reports, plus ablations.

    from gpn_jax.checkpoints.restore import load_run
    from gpn_jax.analysis import analyze
    results = analyze(load_run("/tmp/run"), out="/tmp/run_analysis")

Two passes over the run's own held-out windows (rebuilt exactly as training built them): one
streaming pass collects the statistics (`collect`), then one pass evaluates the ablations, which
need s̄ and the head pools from the first. Writes `metrics.json`, `report.md` and the PNG
figures into `out`.
"""

import dataclasses
import json
import os
import time

import numpy as np

from gpn_jax.analysis import ablations, collect, figures, horizons, report, summarize
from gpn_jax.io import paths
from gpn_jax.io.files import atomic_write
from gpn_jax.io.outputs import check_outside
from gpn_jax.io.regular import read_regular_file


@dataclasses.dataclass(frozen=True)
class AnalysisConfig:
    """Knobs of one analysis; the defaults analyse all held-out windows of the run.

    max_batches: held-out batches analysed (0: all).
    ablation_batches: held-out batches for the ablation PPLs (0: all; -1: no ablations).
    batch_size, seq_len: held-out window geometry (0: training's).
    micro_batch: windows per device call, in both passes (device memory ~ T x micro_batch x d
      floats a few times over, plus the loss's decode chunk).
    sample_size: states kept in the bounded random sample (the only raw rows ever held).
    dead_rel: a dimension is dead if its std < dead_rel x the largest std.
    fast_max_lag: heads with a 1/e lag at or below this form the fast pool.
    top_k: decoded tokens reported for s̄.
    heatmap_dims: dimensions in the correlation heat-map.
    figures: write the PNG figures.
    seed: the sample, heat-map and random-direction seed.
    cache_dir: token caches ('' : a temporary directory; never the run's workdir).
    """

    max_batches: int = 0
    ablation_batches: int = 0
    batch_size: int = 0
    seq_len: int = 0
    micro_batch: int = 16
    sample_size: int = 4096
    dead_rel: float = 1e-3
    fast_max_lag: float = horizons.FAST_MAX_LAG
    top_k: int = 10
    heatmap_dims: int = 64
    figures: bool = True
    seed: int = 0
    cache_dir: str = ""


def check_model(run) -> None:
    from gpn_jax.models.gpn import GPN

    if not isinstance(run.model, GPN):
        family = run.config.model.get("family", type(run.model).__name__)
        raise ValueError(f"the analyses are for GPN / GPN+M runs; this run's model is {family!r}")


def heldout_windows(data, cfg: AnalysisConfig):
    return data.heldout_windows(cfg.batch_size or None, cfg.seq_len or None)


def analyze(
    run, out: str | None = None, config: AnalysisConfig = AnalysisConfig(), data=None, log=print
) -> dict:
    """Runs every analysis on a restored run (`load_run`); writes the outputs to `out` if given.

    Args:
      run: a `gpn_jax.checkpoints.restore.RestoredRun` of a GPN or GPN+M model.
      out: output folder (created) for metrics.json, report.md and figures; None writes nothing.
      config: an `AnalysisConfig`.
      data: the run's `Data` (default: rebuilt from the run's config, as training built it).
      log: a print-like progress function (None: silent).

    Returns:
      the metrics dict (as in metrics.json).
    """
    check_model(run)
    log = log or (lambda *a, **k: None)
    t0 = time.perf_counter()
    if data is None:
        data = run.data(config.cache_dir or None)  # training's split; the workdir only read
    col = collect.collect(
        run.model,
        run.params,
        heldout_windows(data, config),
        max_batches=config.max_batches,
        micro_batch=config.micro_batch,
        sample_size=config.sample_size,
        seed=config.seed,
    )
    log(f"collected {col.moments.n:,} held-out states in {time.perf_counter() - t0:.1f}s")
    results = _summaries(run, col, data, config)
    if config.ablation_batches >= 0:
        t1 = time.perf_counter()
        results["ablations"], n_rows = _ablations(run, col, data, results, config)
        log(f"ablations ({n_rows} rows) in {time.perf_counter() - t1:.1f}s")
        log(report.ablation_table(results["ablations"]["rows"]))
    results["seconds"] = time.perf_counter() - t0
    if out:
        write_outputs(results, col, out, config)
        log(f"wrote {os.path.join(out, 'report.md')}")
    return summarize.to_json(results)


def _summaries(run, col, data, config: AnalysisConfig) -> dict:
    """The results of the streaming pass: run and data lines, geometry, s̄, horizons."""
    tokenizer = data.tokenizer or run.tokenizer
    results = {
        "run": {
            "workdir": run.workdir,
            "step": int(run.step),
            "model": _model_line(run),
        },
        "data": {
            "source": run.config.data.source,
            "tokens": int(col.moments.n),
            "sequences": col.sequences,
            "batches": col.batches,
            "seq_len": col.seq_len,
            "sample_rows": int(len(col.reservoir.sample)),
        },
        "state_geometry": summarize.state_geometry(col, config.dead_rel),
        "mean_direction": summarize.mean_direction(
            col, run.params, tokenizer, data.unigram_counts, config.top_k
        ),
        "state_horizon": summarize.state_horizon(col),
        "memory_horizon": summarize.memory_horizon(col, config.fast_max_lag),
    }
    sample = col.reservoir.sample
    sbar = col.moments.mean
    if len(sample):
        cos = (
            sample @ sbar / np.maximum(np.linalg.norm(sample, axis=1) * np.linalg.norm(sbar), 1e-30)
        )
        results["mean_direction"]["sample_cos_to_mean_quantiles"] = {
            str(q): float(np.quantile(cos, q)) for q in (0.05, 0.25, 0.5, 0.75, 0.95)
        }
    return results


def _ablations(run, col, data, results: dict, config: AnalysisConfig) -> tuple[dict, int]:
    """The second pass: held-out PPL under each intervention (needs s̄ and the head pools).
    Returns (the ablation results, the number of interventions)."""
    mh = results["memory_horizon"]
    ivs = ablations.interventions(
        run.params, col.moments.mean, mh["pools"] if mh else None, config.seed
    )
    rows = ablations.ablation_ppl(
        run.model,
        run.params,
        heldout_windows(data, config),
        ivs,
        config.ablation_batches or config.max_batches,
        config.micro_batch,
    )
    return rows, len(ivs)


def write_outputs(results: dict, col, out: str, config: AnalysisConfig) -> dict:
    os.makedirs(out, exist_ok=True)
    figs = {}
    if config.figures:
        figs = figures.write_all(
            results, col.moments.covariance, out, config.heatmap_dims, config.seed
        )
    results["figures"] = figs
    summary = summarize.to_json(results)
    atomic_write(os.path.join(out, "metrics.json"), json.dumps(summary, indent=2).encode())
    atomic_write(os.path.join(out, "report.md"), report.render(summary, figs).encode())
    return figs


def _model_line(run) -> str:
    c = run.model.config
    mem = f", H={c.n_heads} x {c.d_key} x {c.d_value}" if c.memory else " (no memory)"
    return f"GPN{'+M' if c.memory else ''} L={c.n_layers}, d={c.d_model}, d_emb={c.d_emb}{mem}, V={c.vocab_size}"


def check_analysis_out(out: str, workdir: str) -> None:
    """Before the analysis: `out` may not lie inside the run's workdir, and a non-empty `out`
    must hold an earlier analysis of this run (whose files a rerun replaces); any other
    directory's files are never replaced. Raises a one-line ValueError."""
    if paths.is_remote(out):
        return
    check_outside(out, workdir)
    full = os.path.realpath(os.path.expanduser(out))
    if not os.path.isdir(full) or not os.listdir(full):
        return
    if _analysed_workdir(os.path.join(full, "metrics.json")) != workdir:
        raise ValueError(
            f"--out={out} is a non-empty directory that holds no analysis of this run; "
            "choose a new or empty --out"
        )


def _analysed_workdir(metrics_path: str) -> str | None:
    """The workdir an earlier analysis's metrics.json names (None: not one of ours)."""
    try:
        data = json.loads(read_regular_file(metrics_path, 64 << 20))  # json: data only
    except (OSError, ValueError, RecursionError):
        return None
    run = data.get("run") if isinstance(data, dict) else None
    return run.get("workdir") if isinstance(run, dict) else None
