"""Microbenchmark of the memory's passes: the reference backend (`gpn_jax.kernels.xla`, the XLA
formulas) against the Pallas kernels, as
microseconds per token and the bytes over M-sized arrays that each pass must move at least
(for an accelerator script to turn into GB/s; `time_passes`).

Each pass runs `reps` times inside one jitted loop whose carry chains the calls (the memory for
`step`, the segment's last memory for `stack`, the cotangent for `grad`, which also takes a
different t each time), so neither dispatch nor loop-invariant hoisting hides the pass. The
inputs are the loop's arguments, never closed over: at the 130M shapes they are gigabytes,
which XLA would otherwise embed in the program as constants.
On the CPU the kernels run in Pallas's interpreter: slow, and no measure of the GPU kernels.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from gpn_jax.kernels import xla as xla_reference
from gpn_jax.kernels.pallas.gpu import memory_kernels

F32 = jnp.float32
PASSES = ("step", "stack", "grad")


def _inputs(B, H, K, U, S, dtype, key):
    ks = jax.random.split(key, 8)
    unit = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    return {
        "M": jax.random.normal(ks[0], (B, H, K, U)).astype(dtype),
        "Ms": jax.random.normal(ks[1], (S, B, H, K, U)).astype(dtype),
        "dM": jax.random.normal(ks[2], (B, H, K, U), F32),
        "k": unit(jax.random.normal(ks[3], (S, B, H, K))),
        "q": unit(jax.random.normal(ks[4], (S, B, H, K))),
        "v": jax.random.normal(ks[5], (S, B, H, U)),
        "beta": jax.random.uniform(ks[6], (S, B, H), minval=0.1, maxval=0.9),
        "eg": jax.random.uniform(ks[7], (S, B, H), minval=0.5, maxval=1.0),
        "keep": jnp.ones((S, B), F32),
    }


def _first_token(x: dict) -> dict:
    """The per-token inputs of `_inputs`' dict at token 0 (what `step` and `grad` take)."""
    return {n: x[n][0] for n in ("k", "q", "v", "beta", "eg")}


def _loops(ops: dict, reps: int) -> dict:
    """One function per pass, `reps` chained calls (see the module docstring): (carry, x) ->
    carry, where x is `_inputs`' dict."""

    def step(M, x):
        one = _first_token(x)

        def body(i, c):
            M, acc = c
            Mn, o = ops["step"](M, one["k"], one["q"], one["v"], one["beta"], one["eg"])
            return Mn, acc + o[0, 0, 0]

        return jax.lax.fori_loop(0, reps, body, (M, jnp.zeros((), F32)))

    def stack(M0, x):
        S = x["k"].shape[0]

        def body(i, c):
            Ms, kM, qM = ops["stack"](c[0], x["k"], x["q"], x["v"], x["beta"], x["eg"], x["keep"])
            return Ms[S - 1], c[1] + kM[0, 0, 0, 0] + qM[0, 0, 0, 0]

        return jax.lax.fori_loop(0, reps, body, (M0, jnp.zeros((), F32)))

    def grad(dM, x):
        S = x["k"].shape[0]
        one = _first_token(x)
        keep_B, v = x["keep"][0], one["v"]

        def body(i, c):
            d, dMk, dMw, inner, mk, mq = ops["grad"](
                x["Ms"], i % S, keep_B, c[0], one["k"], one["q"], v, one["beta"], one["eg"], v, v
            )
            return d, c[1] + dMk[0, 0, 0] + dMw[0, 0, 0] + inner[0, 0] + mk[0, 0, 0] + mq[0, 0, 0]

        return jax.lax.fori_loop(0, reps, body, (dM, jnp.zeros((), F32)))

    # pass -> (loop, its carried argument, whose buffer the loop may take)
    return {"step": (step, "M"), "stack": (stack, "M"), "grad": (grad, "dM")}


def _seconds(fn, arg, x: dict, device) -> float:
    """Wall seconds of one call of a compiled `fn(arg, x)` (compiled and run once first; `arg`
    donated, a fresh copy each call)."""
    f = jax.jit(fn, donate_argnums=0)
    fresh = lambda: jax.device_put(jnp.copy(arg), device)  # noqa: E731
    jax.block_until_ready(f(fresh(), x))
    a = fresh()
    jax.block_until_ready(a)
    t0 = time.perf_counter()
    jax.block_until_ready(f(a, x))
    return time.perf_counter() - t0


def min_bytes_per_token(K: int, U: int, H: int, memory_dtype) -> dict:
    """Bytes over M-sized arrays each pass must move per token (one (H, K, U) memory per token):
    step reads and writes M; stack writes each step's memory (its reads stay on chip);
    grad reads Ms[t] and dM (float32) and writes dM."""
    m = H * K * U * jnp.dtype(memory_dtype).itemsize
    d = H * K * U * 4
    return {"step": 2 * m, "stack": m, "grad": m + 2 * d}


def time_passes(
    B: int,
    H: int,
    K: int,
    U: int,
    memory_dtype="float32",
    backend: str | None = None,
    S: int = 16,
    reps: int = 8,
    passes: tuple[str, ...] = PASSES,
) -> dict:
    """{pass: {"xla_us_per_token", "pallas_us_per_token", "min_bytes_per_token"}} for the three
    passes at (B, H, K, U), the memory stored in `memory_dtype`, on JAX platform `backend`
    (None: the default; Pallas runs interpreted on 'cpu'), for `passes`. A token is one sequence's step:
    B per `step` call, S B per `stack` call."""
    device = jax.devices(backend)[0]
    platform = device.platform
    kern = memory_kernels(interpret=platform == "cpu", platform=platform)
    pallas = {n: getattr(kern, n) for n in PASSES}
    xla = {n: getattr(xla_reference, n) for n in PASSES}
    with jax.default_device(device):
        x = jax.device_put(
            _inputs(B, H, K, U, S, jnp.dtype(memory_dtype), jax.random.key(0)), device
        )
        tokens = {"step": B, "stack": S * B, "grad": B}
        minimum = min_bytes_per_token(K, U, H, memory_dtype)
        out = {n: {"min_bytes_per_token": minimum[n]} for n in passes}
        for label, ops in (("xla", xla), ("pallas", pallas)):
            for name, (fn, arg) in _loops(ops, reps).items():
                if name not in passes:
                    continue
                sec = _seconds(fn, x[arg], x, device)
                out[name][f"{label}_us_per_token"] = sec * 1e6 / (reps * tokens[name])
    return out
