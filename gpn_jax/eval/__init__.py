"""Evaluation and generation: held-out PPL, LAMBADA, streaming long context, associative recall,
sampling. Entry points: `run_evals` (Python), `python -m gpn_jax.evaluate`, `python -m
gpn_jax.generate`.

The suite's names load on first use, so a module of the package that needs no JAX
(`harness_run`, behind `gpn-harness --help`) imports none."""

__all__ = ["EVALS", "format_table", "parse_evals", "run_evals", "write_results"]


def __getattr__(name: str):
    if name in __all__:
        from gpn_jax.eval import suite

        return getattr(suite, name)
    raise AttributeError(f"module 'gpn_jax.eval' has no attribute {name!r}")
