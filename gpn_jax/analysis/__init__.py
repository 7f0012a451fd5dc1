"""Observability suite for GPN / GPN+M: the paper's analyses of the predicted state and memory
(state geometry, the mean direction s̄, state and memory horizons) plus causal ablations.

Entry points: `analyze(load_run(workdir), out)` (Python, Colab) and
`python -m gpn_jax.analyze --workdir=... --out=...`.
"""

from gpn_jax.analysis.analyses import AnalysisConfig, analyze

__all__ = ["AnalysisConfig", "analyze"]
