"""GPN+M on multi-query associative recall (CPU-sized; see `recall_common.py` for the task).

    python -m gpn_jax.train --config=experiments/configs/recall_gpn_m.py --workdir=/tmp/recall_gpn_m
    python -m gpn_jax.evaluate --workdir=/tmp/recall_gpn_m --eval=recall,ppl

Measured (2 shared, heavily loaded CPU cores; 1500 steps in 1m59s wall): held-out query
accuracy 0.9731 (chance 0.0625), held-out PPL 3.72 over all positions (unigram 32.01).
GPN at the same budget (`recall_gpn.py`): 0.1681 / 14.74 -- the matrix memory is what solves
the task. Greedy `gpn_jax.generate --prompt_ids=10,26,13,28,7,30,14,24,10` continues with
the right values 26, 24, 30 for the queried keys 10, 14, 7.
Tuning notes (GPN+M, 1500 steps): lr 3e-3 reached only 0.67 on this task; 8 pairs of 32 keys /
32 values in 64 tokens stayed at chance (0.036) at lr 1e-3 and 3e-3 (a longer plateau).
"""

from experiments.configs.recall_common import recall_config


def get_config(arg: str | None = None):
    return recall_config(memory=True, arg=arg)
