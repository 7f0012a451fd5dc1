"""The pieces of a checkpoint step as orbax is handed them: the data position object Grain's
handler saves, JSON-safe conversion, abstract restore targets, the retention policy."""

from collections.abc import Mapping
from typing import Any

import grain
import jax
from orbax.checkpoint import checkpoint_managers as ocp_policies


class DataState(grain.DatasetIterator):
    """A data-iterator position as Grain's orbax handler saves and restores it (the
    `DatasetIterator` protocol: `get_state` / `set_state` of a JSON dict). A copy frozen at
    save time: the trainer's iterator moves on while an async save is being written. Any
    iterator's state fits (the Grain window pipeline's, or `recall:`'s own generator's)."""

    def __init__(self, state: dict | None = None):
        super().__init__()
        self.state = state

    def __next__(self):
        raise StopIteration

    def get_state(self) -> dict:
        return self.state

    def set_state(self, state: dict) -> None:
        self.state = state


def preservation_policy(keep, keep_best, best_metric, best_mode):
    """Keep the latest `keep` steps plus the best `keep_best` by metric.

    orbax's `max_to_keep` + `best_fn` keeps only the best N (not latest N plus
    best M), so the union is built explicitly from its policies.
    """
    policies = [ocp_policies.LatestN(n=keep)]
    if keep_best is not None:
        policies.append(
            ocp_policies.BestN(
                get_metric_fn=lambda m: float(m[best_metric]),
                # BestN sorts ascending and keeps the tail; reverse for 'min'.
                reverse=best_mode == "min",
                n=keep_best,
                # Steps saved without the metric are governed by LatestN alone.
                keep_checkpoints_without_metrics=False,
            )
        )
    return ocp_policies.AnyPreservationPolicy(policies)


def abstract_leaf(x: Any) -> Any:
    """Concrete jax arrays -> ShapeDtypeStruct carrying their sharding."""
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    return x


def json_safe(tree: Mapping[str, Any] | None) -> dict:
    """Converts numpy/jax scalars so json.dumps accepts them."""
    if tree is None:
        return {}

    def conv(v):
        if isinstance(v, Mapping):
            return {str(k): conv(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [conv(x) for x in v]
        if hasattr(v, "item") and getattr(v, "ndim", None) == 0:
            return v.item()
        return v

    return conv(tree)
