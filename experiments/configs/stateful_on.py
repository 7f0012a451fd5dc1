"""Stateful training (issue #15): the demo-size GPN+M trained with its state carried across
windows (truncated BPTT, reset at every document start), on the same batches as
`stateful_off.py` (both read the 'streams' layout: row r of every batch is the next window of
the r-th contiguous stretch of the training tokens).

    python -m gpn_jax.train --config=experiments/configs/stateful_on.py --workdir=/tmp/st_on
    python -m gpn_jax.evaluate --workdir=/tmp/st_on --eval=stream --stream_documents \\
        --stream_buckets=0,128,256,512,1k,2k --stream_streams=4

What was measured: docs/results.md, "Stateful training".
"""

import ml_collections

from experiments.configs import demo


def get_config(arg: str | None = None, carry_state: bool = True) -> ml_collections.ConfigDict:
    c = demo.get_config(arg)
    c.data.train_layout = "streams"  # the same batches with and without the carry
    c.train.carry_state = carry_state
    # a short run (the machine is shared): 150 steps of 16 x 128 tokens, ~2.5 epochs of streams
    c.train.update(dict(steps=150, eval_every=0, checkpoint_every=150, keep_best=0))
    return c
