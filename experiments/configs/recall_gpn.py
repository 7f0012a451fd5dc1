"""GPN (no matrix memory) on multi-query associative recall, at GPN+M's parameter budget.

    python -m gpn_jax.train --config=experiments/configs/recall_gpn.py --workdir=/tmp/recall_gpn
    python -m gpn_jax.evaluate --workdir=/tmp/recall_gpn --eval=recall,ppl

Measured (2 shared, heavily loaded CPU cores; 1500 steps in 1m34s wall): held-out query
accuracy 0.1681 (chance 0.0625), held-out PPL 14.74 over all positions (unigram 32.01),
against GPN+M's 0.9731 / 3.72 (`recall_gpn_m.py`) at the same budget (55,296 vs 55,300
parameters): the single state alone barely beats chance at recalling 4 pairs.
"""

from experiments.configs.recall_common import recall_config


def get_config(arg: str | None = None):
    return recall_config(memory=False, arg=arg)
