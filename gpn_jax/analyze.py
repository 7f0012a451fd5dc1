"""Analyses a trained GPN / GPN+M run on its own held-out data.

    python -m gpn_jax.analyze --workdir=/tmp/run --out=/tmp/run_analysis

State geometry, the mean direction s̄, state and memory horizons (the paper's analyses)
and causal ablations; writes `metrics.json`, `report.md` and PNG figures into
`--out` (required: the run's workdir is only read; token caches go to `--cache_dir` or a
temporary directory) and prints the ablation table. Thin absl launcher over
`gpn_jax.analysis.analyze`. User errors print one line and exit with status 1.
"""

from absl import flags

from gpn_jax.io import cli

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory holding checkpoints.")
_OUT = flags.DEFINE_string("out", None, "Output folder (the workdir itself is never written).")
_CACHE = flags.DEFINE_string(
    "cache_dir", "", "Token caches (default: a temporary directory; never the workdir)."
)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the newest readable one).")
_MAX_BATCHES = flags.DEFINE_integer("max_batches", 0, "Held-out batches analysed (0: all).")
_ABL_BATCHES = flags.DEFINE_integer(
    "ablation_batches",
    0,
    "Held-out batches per ablation (0: as --max_batches; -1: skip ablations).",
)
_BATCH = flags.DEFINE_integer("batch_size", 0, "Held-out windows per batch (0: training's).")
_SEQ = flags.DEFINE_integer("seq_len", 0, "Held-out window length (0: training's).")
_MICRO = flags.DEFINE_integer("micro_batch", 16, "Windows per device call (bounds memory).")
_SAMPLE = flags.DEFINE_integer("sample_size", 4096, "States kept in the random sample.")
_FIGURES = flags.DEFINE_bool("figures", True, "Write PNG figures.")
_SEED = flags.DEFINE_integer("seed", 0, "Sample / heat-map / random-direction seed.")
flags.mark_flags_as_required(["workdir"])


def analyze(workdir: str) -> dict:
    from gpn_jax.io.outputs import check_out_dir

    # before any work, JAX's import included: an output that cannot be written fails at once
    if not _OUT.value:
        raise ValueError("--out is required (the analysis never writes into the run's workdir)")
    check_out_dir(_OUT.value, "--out")
    from gpn_jax.analysis import AnalysisConfig
    from gpn_jax.analysis.analyses import analyze as run_analysis
    from gpn_jax.analysis.analyses import check_analysis_out, check_model
    from gpn_jax.checkpoints.restore import load_run

    cli.settle_heap()  # the imported stack out of the garbage collector's passes
    config = AnalysisConfig(
        max_batches=_MAX_BATCHES.value,
        ablation_batches=_ABL_BATCHES.value,
        batch_size=_BATCH.value,
        seq_len=_SEQ.value,
        micro_batch=_MICRO.value,
        sample_size=_SAMPLE.value,
        figures=_FIGURES.value,
        seed=_SEED.value,
        cache_dir=_CACHE.value,
    )
    for name in ("max_batches", "batch_size", "seq_len", "micro_batch", "sample_size"):
        if getattr(config, name) < 0:
            raise ValueError(f"--{name} must be >= 0")
    run = load_run(workdir, _STEP.value)
    check_model(run)
    check_analysis_out(_OUT.value, run.workdir)
    return run_analysis(run, _OUT.value, config)


def _body():
    return analyze(_WORKDIR.value)


main, run = cli.absl_entry(_body, "gpn-analyze")


if __name__ == "__main__":
    run()
