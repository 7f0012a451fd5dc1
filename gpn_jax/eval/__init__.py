"""Evaluation and generation: held-out PPL, LAMBADA, streaming long context, associative recall,
sampling. Entry points: `run_evals` (Python), `python -m gpn_jax.evaluate`, `python -m
gpn_jax.generate`."""

from gpn_jax.eval.suite import EVALS, format_table, parse_evals, run_evals, write_results

__all__ = ["EVALS", "format_table", "parse_evals", "run_evals", "write_results"]
