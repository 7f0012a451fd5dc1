"""GPN+M on multi-query associative recall (CPU-sized; see `recall_common.py` for the task).

    python -m gpn_jax.train --config=experiments/configs/recall_gpn_m.py --workdir=/tmp/recall_gpn_m
    python -m gpn_jax.evaluate --workdir=/tmp/recall_gpn_m --eval=recall,ppl

Expected on 2 CPU cores (1500 steps in under a minute of training): held-out query
accuracy 0.9632 (chance 0.0625), held-out PPL 4.48 over all positions (unigram 32.01).
GPN at the same budget (`recall_gpn.py`): 0.1374 / 15.13 -- the matrix memory is what solves
the task. Greedy `gpn_jax.generate --prompt_ids=10,26,13,28,7,30,14,24,10` answers 26 for
key 10, then asks key 14 itself and answers 24; prompts ending in 7 or 13 get 30 and 28.
Tuning notes (GPN+M, 1500 steps): lr 3e-3 reached only 0.67 on this task; 8 pairs of 32 keys /
32 values in 64 tokens stayed at chance (0.036) at lr 1e-3 and 3e-3 (a longer plateau).
"""

from experiments.configs.recall_common import recall_config


def get_config(arg: str | None = None):
    return recall_config(memory=True, arg=arg)
