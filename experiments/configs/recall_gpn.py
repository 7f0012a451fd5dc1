"""GPN (no matrix memory) on multi-query associative recall, at GPN+M's parameter budget.

    python -m gpn_jax.train --config=experiments/configs/recall_gpn.py --workdir=/tmp/recall_gpn
    python -m gpn_jax.evaluate --workdir=/tmp/recall_gpn --eval=recall,ppl

Expected on 2 CPU cores: held-out query accuracy 0.1374 (chance 0.0625),
held-out PPL 15.13 over all positions (unigram 32.01), against GPN+M's 0.9632 / 4.48
(`recall_gpn_m.py`) at the same budget (55,296 vs 55,300 parameters): the single state
alone barely beats chance at recalling 4 pairs.
"""

from experiments.configs.recall_common import recall_config


def get_config(arg: str | None = None):
    return recall_config(memory=False, arg=arg)
