"""The train step's path to the per-token step is short: one `value_and_grad` (taken per device
inside the data-parallel shard_map), one accumulation path, no pass-through wrappers.

Counted at trace time: the per-token step is replaced by one that records the Python stack and
stops the trace, and the gpn_jax frames from `train_step` down to it are counted (JAX's own
frames are not the project's path)."""

import traceback

import jax
import jax.numpy as jnp
import optax
import pytest

from gpn_jax.core import gpn as core_gpn
from gpn_jax.core.fused import forward as fused_forward
from gpn_jax.models.gpn import GPN, GPNConfig
from gpn_jax.training import train_step as ts

MAX_FRAMES = 12  # train_step ... the per-token step, both included


class _Reached(Exception):
    pass


def _path_to(module, monkeypatch, scan_impl: str, grad_accum: int) -> list[str]:
    seen = []

    def recording_step(*args, **kw):
        seen.extend(traceback.extract_stack()[:-1])
        raise _Reached

    monkeypatch.setattr(module, "step", recording_step)
    config = GPNConfig(64, 16, 8, 32, n_heads=2, d_key=4, d_value=8, scan_impl=scan_impl)
    model, opt = GPN(config), optax.sgd(0.1)
    state = jax.eval_shape(lambda: ts.init_train_state(model, opt, jax.random.PRNGKey(0)))
    step = jax.jit(ts.make_train_step(model, opt, grad_accum))
    with pytest.raises(_Reached):
        step.trace(state, jax.ShapeDtypeStruct((4, 8), jnp.int32))
    ours = [f for f in seen if "/gpn_jax/" in f.filename.replace("\\", "/")]
    start = max(i for i, f in enumerate(ours) if f.name == "train_step")
    return [f"{f.filename.rsplit('gpn_jax', 1)[-1]}:{f.name}" for f in ours[start:]] + ["step"]


@pytest.mark.parametrize(
    "module, scan_impl",
    [(fused_forward, "fused"), (core_gpn, "autodiff")],
    ids=["fused", "autodiff"],
)
@pytest.mark.parametrize("grad_accum", [1, 2])
def test_at_most_twelve_frames_from_the_train_step_to_the_per_token_step(
    module, scan_impl, grad_accum, monkeypatch
):
    path = _path_to(module, monkeypatch, scan_impl, grad_accum)
    # the micro-batch loop adds its scan body, nothing else
    assert len(path) <= MAX_FRAMES + (grad_accum > 1), (
        f"{len(path)} frames from train_step to the per-token step (at most {MAX_FRAMES}): "
        + " -> ".join(path)
    )
    assert sum("value_and_grad" in f for f in path) == 1, path  # one gradient taken, one path
