"""What one time step of the fused GPN+M window costs on this machine, part by part.

    python experiments/bench/loop_costs.py [--batch=16] [--steps=256]

The fused window (`gpn_jax/core/fused/window.py`) leaves inside its per-token loops only what is
truly recurrent: products of the B-row state with the fused weight matrices, and passes over
the (B, H, K, U) memory matrix. This script times each kind alone in a `lax.scan` of `--steps`
steps at the `bench_small` GPN+M sizes (`gpn_jax/benchmarks/bench_config.py`), next to the
machine's square-matmul peak and one large out-of-loop product, so a profile of the real step
can be read against them:

  * the forward's per-token products, B x D @ D x N for W0, W2o and the ground gate;
  * the backward's input cotangents through the transposed matrices;
  * both kinds again through the compiled kernel the fused window uses where it can
    (`gpn_jax/kernels/cpu/small_matmul.py`; its column is empty where the kernel is not available);
  * one pass over a memory-sized array per step (read and write it once), for 1, 2 and 4
    arrays of its size, which is what each elementwise stage of the write, the read and their
    backward costs when it cannot fuse with a neighbouring matrix product;
  * the forward W0 product again while each step also streams 2, 4 or 8 MiB of other data
    (the pass's own time, measured alone, subtracted): how much slower the product gets when
    its weights (10 MB) no longer stay in the cache from one step to the next, as in the real
    step, which streams the memory state and the stacked activations between its products;
  * the products outside the loops, which have many rows: one segment's weight gradient of W0
    (contraction over 32 steps x B rows) and one loss chunk's logits; and the weight gradients
    of W0 and of the loss chunk's embedding as the window computes them (`fused.products.wgrad`,
    its small input materialised transposed) next to one dot contracting both operands' first
    axis, which XLA:CPU ran up to half as fast.

Each figure is the best of 5 timings (a shared machine slows some of them). Nothing is asserted.
"""

import time

import jax
import jax.numpy as jnp
from absl import app, flags

from gpn_jax.benchmarks import bench_config
from gpn_jax.core.fused import products as fused_products
from gpn_jax.kernels.cpu import small_matmul


def best_time(fn, *args, reps: int = 5) -> float:
    f = jax.jit(fn)
    jax.block_until_ready(f(*args))
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        best = min(best, time.perf_counter() - t)
    return best


def recurrent_product(
    rows: int, n_in: int, n_out: int, steps: int, stream_mib: int = 0, native: bool = False
) -> float:
    """Seconds per step of x (rows, n_in) <- f(x @ W (n_in, n_out)) in a scan. With
    `stream_mib`, each step also reads and writes that many MiB of other data after the
    product (as the real step's memory passes and stacked activations do), so the weights
    must share the cache with it. `native`: the product through the fused window's kernel, W
    packed once outside the loop as the window packs it."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    w = jax.random.normal(k1, (n_in, n_out)) / n_in**0.5
    x = jax.random.normal(k2, (rows, n_in))
    other = jnp.zeros((stream_mib * 2**18,))  # float32: 2^18 per MiB
    reps = -(-n_in // n_out)

    def loop(w, x, other):
        if native:
            w = small_matmul.pack(w)

        def body(carry, _):
            s, other = carry
            y = jnp.tanh(small_matmul.matmul(s, w) if native else s @ w)
            s = jnp.tile(y, (1, reps))[:, :n_in] if reps > 1 else y[:, :n_in]
            return (s, other * 0.999 + y[0, 0] if stream_mib else other), None

        return jax.lax.scan(body, (x, other), None, length=steps)[0]

    return best_time(loop, w, x, other) / steps


def memory_passes(shape: tuple, arrays: int, steps: int) -> float:
    """Seconds per step of one read-and-write pass over `arrays` arrays of `shape`."""
    ms = tuple(jnp.ones(shape) for _ in range(arrays))

    def loop(ms):
        def body(ms, t):
            return tuple(m * 0.999 + t for m in ms), None

        return jax.lax.scan(body, ms, jnp.arange(steps, dtype=jnp.float32) * 1e-6)[0]

    return best_time(loop, ms) / steps


def big_product(m: int, k: int, n: int) -> float:
    a = jax.random.normal(jax.random.PRNGKey(1), (m, k))
    b = jax.random.normal(jax.random.PRNGKey(2), (k, n))
    return best_time(lambda a, b: a @ b, a, b)


def weight_gradient(rows: int, n_in: int, n_out: int, window: bool) -> float:
    """Seconds of x (rows, n_in)^T @ dz (rows, n_out): as `fused.products.wgrad` (window) or as
    one dot contracting both operands' first axis."""
    x = jax.random.normal(jax.random.PRNGKey(1), (rows, n_in))
    dz = jax.random.normal(jax.random.PRNGKey(2), (rows, n_out))
    if window:
        w = jnp.zeros((n_in, n_out))
        return best_time(lambda x, dz: fused_products.wgrad(x[None], dz[None], w), x, dz)
    dims = (((0,), (0,)), ((), ()))
    return best_time(lambda x, dz: jax.lax.dot_general(x, dz, dims), x, dz)


def fused_widths(m) -> tuple[int, int]:
    """(columns of the fused W0: the write's [k | v | beta | a] and layer 0's
    [w1 | w3 | wpg | wq | wrg], rows of W2o = [W2; Wo]) of a one-layer GPN+M config block."""
    D, F, H, K, U = m.d_model, m.d_ffn, m.n_heads, m.d_key, m.d_value
    return (H * K + H * U + 2 * H) + (2 * F + D + H * K + H * U), F + H * U


def _out_of_the_loop(m, B: int, D: int, n0: int) -> None:
    """The products the window runs once per segment or loss chunk, against the peak."""
    peak_s = big_product(2048, 2048, 2048)
    print(f"square matmul 2048^3: {2 * 2048**3 / peak_s / 1e9:.0f} GFLOP/s (the bench's peak)")
    sb = 32 * B  # a memory-checkpoint segment of 32 steps (`fused.window.MIN_SEGMENT`)
    for what, (i, c, o) in {
        "W0's weight gradient per segment": (D, sb, n0),
        "loss chunk's logits (32 positions)": (sb, m.d_emb, m.vocab_size),
    }.items():
        t = big_product(i, c, o)
        print(
            f"out of the loop, {what}: ({i} x {c}) @ ({c} x {o}) {2 * i * c * o / t / 1e9:.0f} GFLOP/s"
        )
    for what, (c, i, o) in {
        "W0's weight gradient per segment": (sb, D, n0),
        "loss chunk's embedding gradient": (sb, m.d_emb, m.vocab_size),
    }.items():
        t_w, t_d = (weight_gradient(c, i, o, window) for window in (True, False))
        print(
            f"out of the loop, {what}: ({i} x {c}) @ ({c} x {o}) as the window computes it "
            f"{2 * i * c * o / t_w / 1e9:.0f} GFLOP/s ({t_w * 1e3:.1f} ms), one dot contracting "
            f"both first axes {2 * i * c * o / t_d / 1e9:.0f} GFLOP/s ({t_d * 1e3:.1f} ms)"
        )


def main(argv):
    del argv
    m = bench_config.models().gpn_m
    B, S = flags.FLAGS.batch, flags.FLAGS.steps
    D = m.d_model
    n0, r = fused_widths(m)
    print(f"{jax.devices()[0].device_kind}, {jax.device_count()} device(s), B={B}, {S} steps")
    _out_of_the_loop(m, B, D, n0)
    native = small_matmul.available()
    print(f"\nthe kernel's column: {small_matmul.status()}")
    print("\n| per-step part | us / step | GFLOP/s | kernel: us / step | GFLOP/s |")
    print("|---|---:|---:|---:|---:|")
    for name, (i, o) in {
        f"forward W0 ({D} x {n0})": (D, n0),
        f"forward W2o ({r} x {D})": (r, D),
        f"forward gate ({D} x {D})": (D, D),
        f"backward W0^T ({n0} x {D})": (n0, D),
        f"backward W2o^T ({D} x {r})": (D, r),
    }.items():
        s = recurrent_product(B, i, o, S)
        kernel = "| - | -"
        if native:
            k = recurrent_product(B, i, o, S, native=True)
            kernel = f"| {1e6 * k:.0f} | {2 * B * i * o / k / 1e9:.0f}"
        print(f"| {name} | {1e6 * s:.0f} | {2 * B * i * o / s / 1e9:.0f} {kernel} |")
    for mib in (2, 4, 8):
        alone = memory_passes((mib * 2**18,), 1, S)
        cells = ["- | -", "- | -"]
        for i, use in enumerate((False, True) if native else (False,)):
            s = recurrent_product(B, D, n0, S, stream_mib=mib, native=use) - alone
            cells[i] = f"{1e6 * s:.0f} | {2 * B * D * n0 / s / 1e9:.0f}"
        print(
            f"| forward W0 while {mib} MiB stream per step (its {1e6 * alone:.0f} us subtracted) "
            f"| {' | '.join(cells)} |"
        )
    shape = (B, m.n_heads, m.d_key, m.d_value)
    mib = B * m.n_heads * m.d_key * m.d_value * 4 / 2**20
    for n in (1, 2, 4):
        s = memory_passes(shape, n, S)
        print(
            f"| {n} memory-sized pass(es), {n * mib:.0f} MiB read + written | {1e6 * s:.0f} "
            "| - | - | - |"
        )


if __name__ == "__main__":
    # defined here, not on import: a test imports `fused_widths` next to other scripts' flags
    flags.DEFINE_integer("batch", 16, "Rows of the recurrent products (the batch B).")
    flags.DEFINE_integer("steps", 256, "Time steps per timed scan.")
    app.run(main)
