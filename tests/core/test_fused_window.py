"""The fused GPN window (`scan_impl="fused"`) against the plain autodiff scan: loss, carry, gradients.

Every check compiles two small programs; the cases are chosen so that together they cover
L = 1 and 2, memory on / off, decoder bias, a nonzero or fresh initial carry, a cotangent on
the final carry, several memory-checkpoint segments, remat segments, loss chunks and T = 1.
"""

import dataclasses
import functools

import jax
import jax.extend.core as jax_core
import jax.numpy as jnp
import numpy as np
import pytest

from gpn_jax.core.fused import layout as fused_layout
from gpn_jax.core.fused import products as fused_products
from gpn_jax.core.fused import window as fused_window
from gpn_jax.core.gpn import Intervention
from gpn_jax.models import gpn as gpn_model
from tests.helpers.window import (
    KERNEL_CHOICES,
    NO_MEM,
    B,
    loss_and_grads,
    pair,
    random_carry,
    random_params,
    require_kernels,
    tokens,
    window_bound,
)
from tests.tolerance import assert_rel_close

CASES = {
    # without remat, memory checkpoints every MIN_SEGMENT = 4 steps (patched below): 4 segments
    "L1-bias": (dict(n_layers=1, decoder_bias=True), 16, True),
    "L2-remat4-chunk4": (dict(n_layers=2, remat_segment=4, loss_chunk=4), 16, True),
    "L2-nomem": (dict(n_layers=2, **NO_MEM), 16, True),
    "L1-nomem-remat4-fresh": (dict(n_layers=1, remat_segment=4, **NO_MEM), 8, False),
    # the rerun from the kept reads, every step of a segment at once
    "L2-remat4-parallel": (dict(n_layers=2, remat_segment=4, remat_parallel=True), 16, True),
    "L1-nomem-remat4-parallel": (
        dict(n_layers=1, remat_segment=4, remat_parallel=True, **NO_MEM),
        8,
        False,
    ),
    # 3 tokens per loop iteration, which divides no segment's 4 steps
    "L1-remat4-parallel-unroll3": (
        dict(n_layers=1, remat_segment=4, remat_parallel=True, scan_unroll=3),
        16,
        True,
    ),
    "L2-T1": (dict(n_layers=2), 1, True),
    "L2-T3-fresh": (dict(n_layers=2, decoder_bias=True), 3, False),
}


@functools.cache
def case_reference(name):
    """(params, carry, autodiff loss, carry and gradients) of a case: the autodiff scan does not
    use `model.kernels`, so every kernel choice compares against the one reference."""
    kw, t, nonzero_carry = CASES[name]
    ref, _ = pair(**kw)
    params = random_params(ref)
    carry = random_carry(ref) if nonzero_carry else ref.init_state(B)
    return params, carry, loss_and_grads(ref, params, tokens(t), carry)


@pytest.mark.parametrize("kernels", KERNEL_CHOICES)
@pytest.mark.parametrize("name", list(CASES))
def test_loss_carry_and_gradients_equal_autodiff(name, kernels, monkeypatch):
    """Each case on the XLA formulas and, where they build, the C++ kernels."""
    require_kernels(kernels)
    monkeypatch.setattr(fused_window, "MIN_SEGMENT", 4)
    kw, t, _ = CASES[name]
    _, fused = pair(kernels=kernels, **kw)
    params, carry, ((_, (loss_r, carry_r)), grads_r) = case_reference(name)
    (_, (loss_f, carry_f)), grads_f = loss_and_grads(fused, params, tokens(t), carry)
    # the same values rounded in another order along T steps of contractions (`window_bound`)
    bound = window_bound(t)
    assert_rel_close(loss_f, loss_r, bound, "loss")
    assert_rel_close(carry_f, carry_r, bound, "carry")
    assert_rel_close(grads_f, grads_r, bound, "gradients")


@functools.cache
def resets_reference(remat):
    """(params, carry, tokens, resets, autodiff loss, carry and gradients) of the resets case,
    shared by the kernel choices (`case_reference`)."""
    ref, _ = pair(n_layers=1, d_key=8, d_value=16, remat_segment=remat)
    params, carry, x = random_params(ref), random_carry(ref), tokens(16)
    resets = jnp.zeros(x.shape, bool).at[0, 5].set(True).at[1, 8].set(True)
    return params, carry, x, resets, loss_and_grads(ref, params, x, carry, resets)


@pytest.mark.parametrize("kernels", KERNEL_CHOICES)
@pytest.mark.parametrize("remat, parallel", [(0, False), (4, False), (4, True)])
def test_memory_passes_with_resets_and_remat_equal_autodiff(kernels, remat, parallel, monkeypatch):
    """One predict layer (where every memory pass can be a kernel's), document resets, 4
    segments, without remat, with remat rerun token by token and with it rerun from the kept
    reads at once: the loss, final carry and gradients against autodiff."""
    require_kernels(kernels)
    monkeypatch.setattr(fused_window, "MIN_SEGMENT", 4)
    kw = dict(n_layers=1, d_key=8, d_value=16, remat_segment=remat, remat_parallel=parallel)
    _, fused = pair(kernels=kernels, **kw)
    params, carry, x, resets, ((_, (loss_r, carry_r)), grads_r) = resets_reference(remat)
    (_, (loss_f, carry_f)), grads_f = loss_and_grads(fused, params, x, carry, resets)
    bound = window_bound(16)  # T = 16 steps of contractions rounded in another order
    assert_rel_close(loss_f, loss_r, bound, "loss")
    assert_rel_close(carry_f, carry_r, bound, "carry")
    assert_rel_close(grads_f, grads_r, bound, "gradients")


# The tensor-parallel layout (module doc of `fused.window`: tp column blocks, the predict gate its
# own projection, the read norm's scale after Wo and its hand-written derivative) on one
# device, where the blocks are an ordinary array axis; `tests/parallel/test_sharding.py`
# splits them over a mesh. (config, tp, T); every case from a random carry, with resets.
TP_CASES = {
    "tp2-L2": (dict(n_layers=2, n_heads=4), 2, 16),
    "tp4-L1-remat4-bias": (dict(n_layers=1, n_heads=4, remat_segment=4, decoder_bias=True), 4, 8),
    "tp2-L2-nomem": (dict(n_layers=2, **NO_MEM), 2, 8),
    # without memory the split layers read nothing: the rerun at once works per block too
    "tp2-L2-nomem-parallel": (
        dict(n_layers=2, remat_segment=4, remat_parallel=True, **NO_MEM),
        2,
        8,
    ),
}


@pytest.mark.parametrize("name", list(TP_CASES))
def test_tensor_parallel_layout_equals_autodiff(name, monkeypatch):
    monkeypatch.setattr(fused_window, "MIN_SEGMENT", 4)
    kw, tp, t = TP_CASES[name]
    ref, fused = pair(**kw)
    params, carry, x = random_params(ref), random_carry(ref), tokens(t)
    resets = jnp.zeros((B, t), bool).at[0, 5].set(True).at[1, 4].set(True)

    def run(model):
        def f(p, c):
            loss, (c2, _) = model.loss(p, x, c, resets=resets)
            return loss + 0.1 * sum(jnp.sum(jnp.sin(a)) for a in jax.tree.leaves(c2)), (loss, c2)

        return jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(params, carry)

    (_, (loss_r, carry_r)), grads_r = run(ref)
    # the block layout a tensor axis of size tp gets (`GPN.partitioned`), on one device
    (_, (loss_f, carry_f)), grads_f = run(gpn_model.GPN(fused.config, (tp, None)))
    # as the one-block layout: T steps of contractions rounded in another order
    bound = window_bound(t)
    assert_rel_close(loss_f, loss_r, bound, "loss")
    assert_rel_close(carry_f, carry_r, bound, "carry")
    assert_rel_close(grads_f, grads_r, bound, "gradients")


def test_tensor_parallel_layout_bfloat16_close_to_autodiff():
    ref, fused = pair(n_layers=2, n_heads=4, compute_dtype="bfloat16", memory_dtype="bfloat16")
    params, x = random_params(ref), tokens(8)
    grad = lambda m: jax.jit(jax.grad(lambda p: m.loss(p, x)[0]))(params)
    g_r = jax.tree.leaves(grad(ref))
    fused = gpn_model.GPN(fused.config, (2, None))
    for a, b in zip(g_r, jax.tree.leaves(grad(fused)), strict=True):
        assert bool(jnp.all(jnp.isfinite(b)))
        a, b = a.astype(jnp.float32).ravel(), b.astype(jnp.float32).ravel()
        cos = jnp.vdot(a, b) / (jnp.linalg.norm(a) * jnp.linalg.norm(b) + 1e-12)
        # bfloat16 rounds each product to 2^-8 relative (the two paths in different places):
        # directions within ~5 such roundings, 1 - cos <= 0.02; zero leaves exempt
        assert float(cos) > 0.98 or float(jnp.linalg.norm(a)) < 1e-6


def test_tensor_parallel_layout_needs_whole_heads_per_block():
    _, fused = pair(n_layers=1)  # 3 heads
    params = random_params(fused)
    with pytest.raises(ValueError, match=r"n_heads=3 and d_ffn=20 must be divisible by its size 2"):
        fused_window.dims_of(params, 8, tp=2)


def test_token_losses_states_and_log_decay_gradient_equal_autodiff():
    ref, fused = pair(n_layers=2)
    params, carry, x = random_params(ref), random_carry(ref), tokens(12)

    def run(m):
        def f(p):
            ce, c = m.token_losses(p, x, carry)
            out, _, _ = m.predicted_states(p, x, carry)
            g = jax.grad(lambda q: jnp.sum(jnp.cos(m.predicted_states(q, x, carry)[0].log_decay)))(
                p
            )
            return ce, c, out, g

        return jax.jit(f)(params)

    # per leaf relative to its norm (element-wise, entries near zero lose their relative
    # precision); T = 12 steps of contractions rounded in another order (`window_bound`)
    assert_rel_close(run(fused), run(ref), window_bound(12), "fused vs autodiff")


def test_intervention_is_refused_by_fused_and_runs_on_autodiff():
    ref, fused = pair(n_layers=1)
    assert fused.config.scan_impl == "fused" and ref.config.scan_impl == "autodiff"
    params, x = random_params(fused), tokens(8)
    iv = Intervention(read_scale=jnp.asarray(0.5))
    with pytest.raises(ValueError, match=r"scan_impl='fused' does not run interventions; use"):
        jax.eval_shape(lambda p: fused.loss(p, x, iv=iv), params)
    assert fused.autodiff().config == ref.config
    loss = lambda m, iv: float(jax.jit(lambda p: m.loss(p, x, iv=iv)[0])(params))
    assert loss(fused.autodiff(), iv) == loss(ref, iv) != loss(ref, Intervention())  # it acts


def test_bfloat16_close_to_autodiff():
    ref, fused = pair(n_layers=2, compute_dtype="bfloat16")
    params, x = random_params(ref), tokens(8)
    grad = lambda m: jax.jit(jax.grad(lambda p: m.loss(p, x)[0]))(params)
    g_r, g_f = jax.tree.leaves(grad(ref)), jax.tree.leaves(grad(fused))
    for a, b in zip(g_r, g_f, strict=True):
        assert bool(jnp.all(jnp.isfinite(b)))
        a, b = a.astype(jnp.float32).ravel(), b.astype(jnp.float32).ravel()
        cos = jnp.vdot(a, b) / (jnp.linalg.norm(a) * jnp.linalg.norm(b) + 1e-12)
        # bfloat16 rounds each product to 2^-8 relative (the two paths in different places):
        # directions within ~5 such roundings, 1 - cos <= 0.02; zero leaves exempt
        assert float(cos) > 0.98 or float(jnp.linalg.norm(a)) < 1e-6


def test_jits_once():
    _, fused = pair(n_layers=1, **NO_MEM)
    params = random_params(fused)
    traces = []

    def step(p, x):
        traces.append(1)
        return jax.value_and_grad(lambda p: fused.loss(p, x)[0])(p)

    f = jax.jit(step)
    for seed in range(3):
        jax.block_until_ready(f(params, tokens(8, seed)))
    assert len(traces) == 1


def test_bad_remat_segment_and_scan_impl():
    _, fused = pair(n_layers=1, remat_segment=3)
    params = random_params(fused)
    with pytest.raises(ValueError, match="not divisible"):
        jax.eval_shape(lambda p: fused.loss(p, tokens(8)), params)
    with pytest.raises(ValueError, match="scan_impl"):
        pair(scan_impl="nope")


def test_default_segment_divides():
    for T in (1, 7, 64, 100, 512, 4096):
        S = fused_window.default_segment(T)
        assert T % S == 0 and 1 <= S <= max(fused_window.MIN_SEGMENT, int(np.sqrt(T)))


def test_weight_gradients_contract_with_only_the_small_input_transposed():
    """A segment's weight and bias gradients sum over its stacked (steps, batch) rows as one
    product each: only the small input x is copied transposed, to (I, S*B), and the
    cotangent dz not at all (an einsum over (s, b) lowers to a dot contracting (b, s), and
    XLA then copies both operands; a dot contracting both operands' first axis ran up to half
    as fast; see `fused.products.wgrad`)."""
    x = jnp.ones((8, 4, 16))
    dz = jnp.ones((8, 4, 24))
    w = jnp.ones((16, 24))

    def grads(x, dz):
        return fused_products.wgrad(x, dz, w), fused_products.bias_grad(dz)

    gw, gb = jax.jit(grads)(x, dz)
    np.testing.assert_array_equal(gw, np.full((16, 24), 32.0))
    np.testing.assert_array_equal(gb, np.full((24,), 32.0))

    def moved(compiled) -> list[str]:
        """The shapes of the transposes and copies in a compiled program."""
        lines = compiled.as_text().splitlines()
        moves = [ln for ln in lines if " transpose(" in ln or " copy(" in ln]
        return [ln.split("=")[1].split()[0].split("{")[0] for ln in moves]

    shapes = moved(jax.jit(grads).lower(x, dz).compile())
    assert shapes and set(shapes) == {"f32[16,32]"}, shapes  # x^T only
    # the einsum it replaced copies dz too (so the check above can fail)
    einsum = jax.jit(lambda x, dz: jnp.einsum("sbi,sbo->io", x, dz)).lower(x, dz).compile()
    assert "f32[4,8,24]" in moved(einsum), moved(einsum)


def _subjaxprs(eqn):
    return jax_core.jaxprs_in_params(eqn.params)


def _has_weight_product(jaxpr) -> bool:
    """Whether a jaxpr, outside any scan nested in it, multiplies by a weight matrix: a
    dot_general without batch axes (the memory's per-head products batch over (b, h))."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general" and not eqn.params["dimension_numbers"][1][0]:
            return True
        if eqn.primitive.name != "scan" and any(map(_has_weight_product, _subjaxprs(eqn))):
            return True
    return False


def _product_loops(jaxpr, lengths) -> int:
    """The scans over `lengths` steps, at any depth, whose steps multiply by weight matrices."""
    n = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan" and eqn.params["length"] in lengths:
            n += _has_weight_product(eqn.params["jaxpr"].jaxpr)
        n += sum(_product_loops(sub, lengths) for sub in _subjaxprs(eqn))
    return n


@pytest.mark.parametrize("n_layers, memory", [(1, True), (2, True), (1, False)])
def test_parallel_rerun_runs_no_per_token_loop_of_the_forward(n_layers, memory):
    """With `remat_parallel` the backward reruns a segment's products at once: over a segment's
    steps (8, or 4 where the token-by-token rerun halves it) the gradient runs two loops of
    products (the forward's and the backward's reverse scan) where the token-by-token rerun
    runs three (per half). T = 16: 2 segments, 1 loss chunk."""
    kw = dict(n_layers=n_layers, remat_segment=8) | ({} if memory else NO_MEM)
    loops = {}
    for parallel in (False, True):
        _, fused = pair(remat_parallel=parallel, **kw)
        params = random_params(fused)
        grad = jax.grad(lambda p: fused.loss(p, tokens(16))[0])  # noqa: B023
        loops[parallel] = _product_loops(jax.make_jaxpr(grad)(params).jaxpr, (8, 4))
    halves = 2 if (memory and n_layers == 1) else 1  # `backward._stack_parts`
    assert loops == {False: 1 + 2 * halves, True: 2}


def _product_scans(jaxpr, lengths, reverse: bool) -> list:
    """The scans over `lengths` steps with weight products, at any depth: the backward's
    (`reverse`) or the forward's."""
    out = []
    for eqn in jaxpr.eqns:
        p = eqn.params
        if eqn.primitive.name == "scan" and p["length"] in lengths and p["reverse"] == reverse:
            if _has_weight_product(p["jaxpr"].jaxpr):
                out.append(eqn)
        for sub in _subjaxprs(eqn):
            out += _product_scans(sub, lengths, reverse)
    return out


def _per_step(scan, variables) -> list:
    """A scan's inputs or outputs that run per step: those with its length as leading axis (no
    carry of these test models has one: B = 2, 3 heads; jax 0.11's scan has no num_carry)."""
    return [v for v in variables if v.aval.shape[:1] == (scan.params["length"],)]


def _stacked_per_step(jaxpr, lengths, reverse: bool) -> set[int]:
    """How many arrays each scan over `lengths` steps with weight products stacks per step."""
    return {len(_per_step(e, e.outvars)) for e in _product_scans(jaxpr, lengths, reverse)}


@pytest.mark.parametrize("n_layers, memory", [(1, True), (2, True), (3, True), (1, False)])
def test_what_the_parallel_rerun_stores_per_step(n_layers, memory):
    """Rerun at once, the forward's loop stores each step's memory read of every layer but the
    last (whose output is p, stored anyway): L - 1 arrays more than the token-by-token rerun's;
    and the backward's loop stores 3 + (L - 1) fewer, the weight products' normalised inputs
    (rms of s, of p and of each further layer's input) and the ground gate's cotangent being
    formed over the segment at once (`backward.inputs_at_once`). The gradients equal
    autodiff's (above)."""
    kw = dict(n_layers=n_layers, remat_segment=8) | ({} if memory else NO_MEM)
    forward, backward = {}, {}
    for parallel in (False, True):
        _, fused = pair(remat_parallel=parallel, **kw)
        params = random_params(fused)
        grad = jax.grad(lambda p: fused.loss(p, tokens(16))[0])  # noqa: B023
        jaxpr = jax.make_jaxpr(grad)(params).jaxpr
        forward[parallel] = _stacked_per_step(jaxpr, (8, 4), reverse=False)
        backward[parallel] = _stacked_per_step(jaxpr, (8, 4), reverse=True)
    # token by token the forward's loop stores (p, g), its rerun every residual
    assert len(forward[True]) == len(backward[True]) == len(backward[False]) == 1, forward
    reads = n_layers - 1 if memory else 0
    assert forward[True].pop() - min(forward[False]) == reads
    assert backward[False].pop() - backward[True].pop() == 3 + (n_layers - 1)


@pytest.mark.parametrize("parallel", [False, True])
def test_the_backward_loop_reads_no_per_step_index(parallel):
    """With the kernels' passes the backward's reverse scan reads each step's memory from the
    segment's stack at an index its carry counts down, not from a per-step integer array (which
    XLA:GPU slices in a kernel of its own at every step); its inputs per step are floats."""
    _, fused = pair(kernels="xla", remat_segment=8, remat_parallel=parallel)
    params = random_params(fused)
    grad = jax.grad(lambda p: fused.loss(p, tokens(16))[0])
    scans = _product_scans(jax.make_jaxpr(grad)(params).jaxpr, (8, 4), reverse=True)
    assert scans
    for scan in scans:
        xs = _per_step(scan, scan.invars)
        assert all(jnp.issubdtype(v.aval.dtype, jnp.floating) for v in xs), scan.params["length"]


def test_scan_unroll_reaches_every_per_token_loop():
    """`scan_unroll` (equal to autodiff above) sets the unroll of the window's loops of weight
    products, forward and backward."""
    _, fused = pair(kernels="xla", remat_segment=8, remat_parallel=True, scan_unroll=3)
    params = random_params(fused)
    jaxpr = jax.make_jaxpr(jax.grad(lambda p: fused.loss(p, tokens(16))[0]))(params).jaxpr
    scans = _product_scans(jaxpr, (8,), reverse=True) + _product_scans(jaxpr, (8,), reverse=False)
    assert len(scans) == 2 and all(scan.params["unroll"] == 3 for scan in scans)


def test_parallel_rerun_refusals():
    """`remat_parallel` without a remat segment, with the autodiff scan, and with a window split
    over the tensor axis (whose layers read the memory inside their blocks) are one-line errors
    naming the field."""
    with pytest.raises(ValueError, match="remat_parallel .* remat_segment > 0"):
        pair(remat_parallel=True)
    with pytest.raises(ValueError, match="remat_parallel .* scan_impl='fused'"):
        pair(remat_parallel=True, remat_segment=4, scan_impl="autodiff")
    ref, _ = pair(n_heads=4, remat_segment=4)
    with pytest.raises(ValueError, match="remat_parallel .* tensor=1"):
        fused_window.dims_of(random_params(ref), 8, 4, tp=2, remat_parallel=True)


@pytest.mark.parametrize("tp", [1, 2])
def test_padded_contractions_equal_autodiff(tp, monkeypatch):
    """The backward's transposed projections padded with zero rows (`layout.transposed`, for
    XLA:GPU's split-K) give the same loss, carry and gradients: here every contraction is
    padded to a multiple of 64 (W0's and the second layer's, per tensor block where tp > 1)."""
    monkeypatch.setattr(fused_layout, "LONG_CONTRACTION", 0)
    monkeypatch.setattr(fused_layout, "CONTRACTION_ALIGN", 64)
    monkeypatch.setattr(fused_window, "MIN_SEGMENT", 4)
    ref, fused = pair(n_layers=2, n_heads=4, remat_segment=4)
    params, carry, x = random_params(ref), random_carry(ref), tokens(8)
    (_, (loss_r, carry_r)), grads_r = loss_and_grads(ref, params, x, carry)
    model = gpn_model.GPN(fused.config, (tp, None))  # the block layout of a tensor axis of tp
    (_, (loss_f, carry_f)), grads_f = loss_and_grads(model, params, x, carry)
    bound = window_bound(8)
    assert_rel_close(loss_f, loss_r, bound, "loss")
    assert_rel_close(carry_f, carry_r, bound, "carry")
    assert_rel_close(grads_f, grads_r, bound, "gradients")


def test_only_long_contractions_of_xla_products_are_padded():
    dm = fused_window.dims_of(random_params(pair()[0]), 8)
    align, long = fused_layout.CONTRACTION_ALIGN, fused_layout.LONG_CONTRACTION
    assert fused_layout.contraction_rows(dm, long - 1) == long - 1  # short: as it is
    assert fused_layout.contraction_rows(dm, 27358) == 27 * align  # the 130M W0's outputs
    assert fused_layout.contraction_rows(dm, 27 * align) == 27 * align
    packed = dataclasses.replace(dm, products=object())  # a CPU product kernel packs W as it is
    assert fused_layout.contraction_rows(packed, 27358) == 27358
