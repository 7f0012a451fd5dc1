"""The bench in one place: its configs (`bench_*.py`), the prepared accelerator run
(`accel_bench.py`) and the probes (`loop_costs.py`, `window_ab.py`, `step_memory.py`). The
library side is `gpn_jax.benchmarks`; results go to experiments/results/."""
