"""The baseline of `stateful_on.py`: the same model and batches, every window from the zero
state (the paper's training)."""

import ml_collections

from experiments.configs import stateful_on


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return stateful_on.get_config(arg, carry_state=False)
