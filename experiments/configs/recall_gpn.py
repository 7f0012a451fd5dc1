"""GPN (no matrix memory) on multi-query associative recall, at GPN+M's parameter budget.

    python -m gpn_jax.train --config=experiments/configs/recall_gpn.py --workdir=/tmp/recall_gpn
    python -m gpn_jax.evaluate --workdir=/tmp/recall_gpn --eval=recall,ppl

The single state alone barely beats chance (1/16) at recalling 4 pairs, where GPN+M
(`recall_gpn_m.py`, the same budget: 55,296 vs 55,300 parameters) recalls almost every query;
the numbers are in docs/results.md.
"""

from experiments.configs.recall_common import recall_config


def get_config(arg: str | None = None):
    return recall_config(memory=False, arg=arg)
