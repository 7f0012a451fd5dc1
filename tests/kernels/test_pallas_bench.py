"""The microbenchmark times the reference backend against the Pallas kernels, and `time_passes`
reports every field it promises (its timings are not asserted)."""

import numpy as np

from gpn_jax.kernels.pallas import bench

B, H, K, U, S = 2, 3, 8, 16, 4


def test_times_the_reference_backend():
    """The bench's XLA side is the reference backend itself: no formulas of its own."""
    assert bench.PASSES == ("step", "stack", "grad")
    assert bench.xla_reference.memory_kernels()[1:4] == tuple(
        getattr(bench.xla_reference, n) for n in bench.PASSES
    )


def test_time_passes_reports_each_field():
    out = bench.time_passes(B, H, K, U, "bfloat16", "cpu", S=S, reps=2, passes=("grad",))
    assert set(out) == {"grad"}
    row = out["grad"]
    assert row["min_bytes_per_token"] == H * K * U * (2 + 2 * 4)  # Ms[t] bf16, dM read + write
    for key in ("xla_us_per_token", "pallas_us_per_token"):
        assert np.isfinite(row[key]) and row[key] > 0, key


def test_the_timed_programs_take_their_inputs_as_arguments():
    """At the 130M shapes the inputs are gigabytes: closed over, XLA would embed them in each
    program as constants. At 8x the batch the lowered programs grow by a few shape digits, far
    less than a tenth of the inputs' bytes (an embedded constant takes two hex characters a
    byte)."""
    import jax

    sizes, nbytes = {}, {}
    for batch in (B, 8 * B):
        x = bench._inputs(batch, H, K, U, S, jax.numpy.float32, jax.random.key(0))
        nbytes[batch] = sum(a.nbytes for a in x.values())
        sizes[batch] = {
            name: len(jax.jit(fn).lower(x[arg], x).as_text())
            for name, (fn, arg) in bench._loops(bench.xla_reference.__dict__, 2).items()
        }
    for name, n in sizes[B].items():
        assert sizes[8 * B][name] - n < nbytes[8 * B] / 10, (name, sizes, nbytes)
