"""The memory's HBM traffic read off optimised HLO (`benchmarks.traffic`): hand-written
modules with known byte counts, a compiled CPU loop, and the analytic minimum."""

import jax
import jax.numpy as jnp
import ml_collections
import pytest
from jax import lax

from gpn_jax.benchmarks import traffic

# M is f32[2,3,4,5]: 120 elements, 480 bytes (bf16: 240)
N, MB = 120, 480

FUSED = """
%fused (p0: f32[2,3,4,5], p1: f32[]) -> f32[2,3,4,5] {
  %p0 = f32[2,3,4,5]{3,2,1,0} parameter(0)
  %p1 = f32[] parameter(1)
  %b = f32[2,3,4,5]{3,2,1,0} broadcast(%p1), dimensions={}
  ROOT %m = f32[2,3,4,5]{3,2,1,0} multiply(%p0, %b)
}
"""


def module(entry: str, extra: str = "") -> str:
    return f"HloModule m\n{FUSED}{extra}\nENTRY %main (a: f32[2,3,4,5], s: f32[]) -> f32[2,3,4,5] {{\n{entry}\n}}\n"


def test_fusion_counts_its_operands_and_result_once():
    text = module(
        "  %a = f32[2,3,4,5]{3,2,1,0} parameter(0)\n"
        "  %s = f32[] parameter(1)\n"
        "  %t = (f32[2,3,4,5]{3,2,1,0}, f32[]) tuple(%a, %s)\n"
        "  %g = f32[2,3,4,5]{3,2,1,0} get-tuple-element(%t), index=0\n"
        "  ROOT %f = f32[2,3,4,5]{3,2,1,0} fusion(%g, %s), kind=kLoop, calls=%fused"
    )
    assert traffic.hlo_bytes(text, N).bytes == 2 * MB  # read M once, write M once
    # the same operand twice is read once
    text2 = text.replace("fusion(%g, %s)", "fusion(%g, %g)")
    assert traffic.hlo_bytes(text2, N).bytes == 2 * MB
    # other sizes do not count
    assert traffic.hlo_bytes(text, N + 1).bytes == 0


def test_vmem_arrays_move_no_hbm_bytes():
    text = module(
        "  %a = f32[2,3,4,5]{3,2,1,0} parameter(0)\n"
        "  %s = f32[] parameter(1)\n"
        "  ROOT %f = f32[2,3,4,5]{3,2,1,0:T(8,128)S(1)} fusion(%a, %s), kind=kLoop, calls=%fused"
    )
    assert traffic.hlo_bytes(text, N).bytes == MB  # the read from HBM; the result is in VMEM
    copies = module(
        "  %a = f32[2,3,4,5]{3,2,1,0} parameter(0)\n"
        "  %cs = (f32[2,3,4,5]{3,2,1,0:S(1)}, f32[2,3,4,5]{3,2,1,0}, u32[]) copy-start(%a)\n"
        "  ROOT %cd = f32[2,3,4,5]{3,2,1,0:S(1)} copy-done(%cs)"
    )
    assert traffic.hlo_bytes(copies, N).bytes == MB  # prefetch: one HBM read


def loop(trip: str, body_extra: str = "") -> str:
    body = """
%body (t: (s32[], f32[2,3,4,5])) -> (s32[], f32[2,3,4,5]) {
  %t = (s32[], f32[2,3,4,5]{3,2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %m = f32[2,3,4,5]{3,2,1,0} get-tuple-element(%t), index=1
  %one = f32[] constant(1)
  %f = bf16[2,3,4,5]{3,2,1,0} fusion(%m, %one), kind=kLoop, calls=%fused
  ROOT %r = (s32[], f32[2,3,4,5]{3,2,1,0}) tuple(%i, %m)
}

%cond (t: (s32[], f32[2,3,4,5])) -> pred[] {
  %t = (s32[], f32[2,3,4,5]{3,2,1,0}) parameter(0)
  %n = s32[]{:T(128)} constant(9)
  %i = s32[] get-tuple-element(%t), index=0
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}
"""
    entry = (
        "  %a = f32[2,3,4,5]{3,2,1,0} parameter(0)\n"
        "  %z = s32[] constant(0)\n"
        "  %t = (s32[], f32[2,3,4,5]{3,2,1,0}) tuple(%z, %a)\n"
        f"  %w = (s32[], f32[2,3,4,5]{{3,2,1,0}}) while(%t), condition=%cond, body=%body{trip}\n"
        "  ROOT %o = f32[2,3,4,5]{3,2,1,0} get-tuple-element(%w), index=1"
    )
    return module(entry, body + body_extra)


def test_while_loops_multiply_by_their_trip_count():
    per_iteration = MB + MB // 2  # f32 read, bf16 write
    known = loop(', backend_config={"known_trip_count":{"n":"5"}}')
    assert traffic.hlo_bytes(known, N).bytes == 5 * per_iteration
    bound = traffic.hlo_bytes(loop(""), N)  # no backend_config: the condition's constant
    assert bound.bytes == 9 * per_iteration and bound.unknown_trip_counts == []
    unknown = loop("").replace("constant(9)", "constant(9)\n  %k = s32[] constant(3)")
    result = traffic.hlo_bytes(unknown, N)
    assert result.bytes == per_iteration and result.unknown_trip_counts == ["body"]


def _stack_module() -> str:
    """A fusion writing M into a stack of 6 in place, another reading one M of it."""
    extra = """
%slice (s: f32[6,2,3,4,5], i: s32[]) -> f32[2,3,4,5] {
  %s = f32[6,2,3,4,5]{4,3,2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %z = s32[] constant(0)
  %d = f32[1,2,3,4,5]{4,3,2,1,0} dynamic-slice(%s, %i, %z, %z, %z, %z), dynamic_slice_sizes={1,2,3,4,5}
  ROOT %b = f32[2,3,4,5]{3,2,1,0} bitcast(%d)
}

%put (s: f32[6,2,3,4,5], m: f32[2,3,4,5], i: s32[]) -> f32[6,2,3,4,5] {
  %s = f32[6,2,3,4,5]{4,3,2,1,0} parameter(0)
  %m = f32[2,3,4,5]{3,2,1,0} parameter(1)
  %i = s32[] parameter(2)
  %z = s32[] constant(0)
  %u = f32[1,2,3,4,5]{4,3,2,1,0} bitcast(%m)
  ROOT %w = f32[6,2,3,4,5]{4,3,2,1,0} dynamic-update-slice(%s, %u, %i, %z, %z, %z, %z)
}
"""
    return module(
        "  %a = f32[2,3,4,5]{3,2,1,0} parameter(0)\n"
        "  %st = f32[6,2,3,4,5]{4,3,2,1,0} parameter(2)\n"
        "  %i = s32[] parameter(3)\n"
        "  %p = f32[6,2,3,4,5]{4,3,2,1,0} fusion(%st, %a, %i), kind=kLoop, calls=%put\n"
        "  ROOT %g = f32[2,3,4,5]{3,2,1,0} fusion(%p, %i), kind=kLoop, calls=%slice",
        extra,
    )


def test_stack_slices_and_in_place_updates_count_one_m():
    text = _stack_module()
    # put: reads M, writes one M-sized slice of the stack in place; slice: reads one slice,
    # writes M
    assert traffic.hlo_bytes(text, N).bytes == 4 * MB


def test_conditional_counts_its_costliest_branch():
    extra = """
%cheap (a: f32[2,3,4,5]) -> f32[2,3,4,5] {
  ROOT %a = f32[2,3,4,5]{3,2,1,0} parameter(0)
}

%dear (a: f32[2,3,4,5]) -> f32[2,3,4,5] {
  %a = f32[2,3,4,5]{3,2,1,0} parameter(0)
  %one = f32[] constant(1)
  ROOT %f = f32[2,3,4,5]{3,2,1,0} fusion(%a, %one), kind=kLoop, calls=%fused
}
"""
    text = module(
        "  %a = f32[2,3,4,5]{3,2,1,0} parameter(0)\n"
        "  %p = pred[] constant(true)\n"
        "  ROOT %c = f32[2,3,4,5]{3,2,1,0} conditional(%p, %a, %a), "
        "true_computation=%cheap, false_computation=%dear",
        extra,
    )
    assert traffic.hlo_bytes(text, N).bytes == 2 * MB


def test_compiled_cpu_loop_moves_m_twice_per_iteration():
    """A jitted loop `M <- M * a + 1` over a donated M: XLA:CPU keeps M in memory, so each
    iteration reads it once and writes it once (one fused elementwise op)."""

    def f(M, a):
        return lax.fori_loop(0, 7, lambda i, M: M * a + 1.0, M)

    compiled = jax.jit(f, donate_argnums=0).lower(jnp.zeros((2, 3, 4, 5)), 2.0).compile()
    result = traffic.hlo_bytes(compiled.as_text(), N)
    assert result.unknown_trip_counts == []
    assert result.bytes == 7 * 2 * MB


def test_minimum_per_token():
    cfg = ml_collections.ConfigDict(
        dict(family="gpn", vocab_size=64, d_model=32, d_emb=16, d_ffn=64, n_heads=15, d_key=128,
             d_value=256, memory_dtype="float32")
    )  # fmt: skip
    cells = 15 * 128 * 256
    # no remat: the backward rebuilds the memory from stored write inputs, writing each step's
    # memory once into the stack (m) where a token-by-token rerun reads and writes it (2m)
    assert traffic.min_bytes_per_token(cfg) == cells * 24  # 4 x 4 + 8
    cfg.remat_segment = 64
    assert traffic.min_bytes_per_token(cfg) == cells * 28  # 5 x 4 + 8
    cfg.remat_parallel = True  # the rerun keeps the memory's reads: rebuilt as without remat
    assert traffic.min_bytes_per_token(cfg) == cells * 24
    cfg.remat_parallel = False
    # the memory on chip between tokens: its stack's write and read (2m)
    assert traffic.min_bytes_per_token(cfg, (True, False)) == cells * 8
    assert traffic.min_bytes_per_token(cfg, (True, True)) == 0  # the stack on chip too
    cfg.memory_dtype = "bfloat16"
    assert traffic.min_bytes_per_token(cfg) == cells * 18  # 5 x 2 + 8
    assert traffic.min_bytes_per_token(cfg, (True, False)) == cells * 4
    cfg.memory = False
    assert traffic.min_bytes_per_token(cfg) is None


def test_placement_reads_where_the_per_token_loops_carry_the_memory():
    """`loop` carries M in HBM; in VMEM (`S(1)`) the memory is on chip; a carried stack in HBM
    keeps the stack off chip, one in VMEM puts it on chip too. Outer loops do not count."""
    hbm = loop("")
    assert traffic.placement(hbm, N) == (False, False)
    vmem = hbm.replace("f32[2,3,4,5]{3,2,1,0}) while", "f32[2,3,4,5]{3,2,1,0:S(1)}) while")
    assert traffic.placement(vmem, N) == (True, False)
    stack = "f32[2,3,4,5]{3,2,1,0:S(1)}, f32[6,2,3,4,5]{4,3,2,1,0}) while"
    with_stack = vmem.replace("f32[2,3,4,5]{3,2,1,0:S(1)}) while", stack)
    assert traffic.loop_carries(with_stack, N) == [(1, True), (6, False)]
    assert traffic.placement(with_stack, N) == (True, False)
    on_chip = with_stack.replace(
        "f32[6,2,3,4,5]{4,3,2,1,0}) while", "f32[6,2,3,4,5]{4,3,2,1,0:S(1)}) while"
    )
    assert traffic.placement(on_chip, N) == (True, True)
    # a loop whose body runs a loop is no per-token loop
    outer = vmem.replace(
        "  ROOT %r = (s32[]",
        "  %x = (s32[]) while(%i), condition=%cond, body=%body\n  ROOT %r = (s32[]",
    )
    assert traffic.loop_carries(outer, N) == []


def test_no_entry_is_an_error():
    with pytest.raises(ValueError, match="no ENTRY computation"):
        traffic.hlo_bytes("HloModule m\n", N)


def test_in_place_fusion_without_operands_counts_its_write():
    """A fusion whose root is an in-place update may take no operand (all inside it)."""
    extra = """
%fill () -> f32[6,2,3,4,5] {
  %z = f32[] constant(0)
  %s = f32[6,2,3,4,5]{4,3,2,1,0} broadcast(%z), dimensions={}
  %m = f32[1,2,3,4,5]{4,3,2,1,0} broadcast(%z), dimensions={}
  %i = s32[] constant(0)
  ROOT %w = f32[6,2,3,4,5]{4,3,2,1,0} dynamic-update-slice(%s, %m, %i, %i, %i, %i, %i)
}
"""
    text = module("  ROOT %f = f32[6,2,3,4,5]{4,3,2,1,0} fusion(), kind=kLoop, calls=%fill", extra)
    assert traffic.hlo_bytes(text, N).bytes == MB  # one M-sized slice written


def test_a_kernel_reads_one_memory_of_a_stack_and_writes_its_results_in_full():
    """A custom call (the memory kernels: tpu_custom_call, Triton, the C++ ones) counts each
    distinct operand once; a stack operand counts one M (the grads read the step t they
    index); its results count in full, a stack it returns too, one in VMEM not at all."""
    grad = module(
        "  %a = f32[2,3,4,5]{3,2,1,0} parameter(0)\n"
        "  %st = bf16[6,2,3,4,5]{4,3,2,1,0} parameter(2)\n"
        "  %i = s32[1]{0} parameter(3)\n"
        "  ROOT %k = (f32[2,3,4,5]{3,2,1,0:T(8,128)}, f32[2,3,4,5]{3,2,1,0:T(8,128)S(1)}) "
        'custom-call(%i, %st, %a, %a), custom_call_target="tpu_custom_call", '
        "output_to_operand_aliasing={{0}: (2, {})}"
    )
    # reads: one bf16 M of the stack + M once; writes: the HBM result (the VMEM one is free)
    assert traffic.hlo_bytes(grad, N).bytes == MB // 2 + MB + MB
    stack = module(
        "  %a = f32[2,3,4,5]{3,2,1,0} parameter(0)\n"
        "  ROOT %k = f32[6,2,3,4,5]{4,3,2,1,0} custom-call(%a), "
        'custom_call_target="tpu_custom_call"'
    )
    assert traffic.hlo_bytes(stack, N).bytes == MB + 6 * MB  # read M0, write the stack


def test_every_array_counts_what_each_operation_moves():
    """`every_array`: the same rules over all arrays, scalars and indices included (a
    fusion's sliced operand by its slices, a buffer updated in place by its write, one memory
    of a stack handed to a kernel); a cuBLAS call's workspace counts nothing."""
    fused = module(
        "  %a = f32[2,3,4,5]{3,2,1,0} parameter(0)\n"
        "  %s = f32[] parameter(1)\n"
        "  ROOT %f = f32[2,3,4,5]{3,2,1,0} fusion(%a, %s), kind=kLoop, calls=%fused"
    )
    assert traffic.hlo_bytes(fused, N, every_array=True).bytes == 2 * MB + 4
    # as M-sized arrays (4 M), plus the step index each of the two fusions reads
    assert traffic.hlo_bytes(_stack_module(), N, every_array=True).bytes == 4 * MB + 2 * 4
    half = """
%half (p: f32[2,3,4,5]) -> f32[1,3,4,5] {
  %p = f32[2,3,4,5]{3,2,1,0} parameter(0)
  %b = f32[2,3,4,5]{3,2,1,0} bitcast(%p)
  %s = f32[1,3,4,3]{3,2,1,0} slice(%b), slice={[0:1], [0:3], [0:4], [0:3]}
  ROOT %t = f32[1,3,4,5]{3,2,1,0} slice(%p), slice={[1:2], [0:3], [0:4], [0:5]}
}
"""
    sliced = module(
        "  %a = f32[2,3,4,5]{3,2,1,0} parameter(0)\n"
        "  ROOT %f = f32[1,3,4,5]{3,2,1,0} fusion(%a), kind=kLoop, calls=%half",
        half,
    )
    # a fusion that only slices its operand (through a bitcast too) reads the slices, 3/10
    # and 1/2 of it (the whole at most), and writes its half
    assert traffic.hlo_bytes(sliced, N, every_array=True).bytes == 3 * MB // 10 + MB // 2 + MB // 2
    grad = module(
        "  %a = f32[2,3,4,5]{3,2,1,0} parameter(0)\n"
        "  %st = bf16[6,2,3,4,5]{4,3,2,1,0} parameter(2)\n"
        "  %i = s32[1]{0} parameter(3)\n"
        "  ROOT %k = f32[2,3,4,5]{3,2,1,0} "
        'custom-call(%i, %st, %a), custom_call_target="__gpu$xla.gpu.triton"'
    )
    assert traffic.hlo_bytes(grad, N, every_array=True).bytes == 4 + MB // 2 + MB + MB
    gemm = module(
        "  %a = f32[2,3,4,5]{3,2,1,0} parameter(0)\n"
        "  ROOT %k = (f32[2,3,4,5]{3,2,1,0}, s8[1000000]{0}) "
        'custom-call(%a, %a), custom_call_target="__cublas$lt$matmul"'
    )
    assert traffic.hlo_bytes(gemm, N, every_array=True).bytes == 2 * MB
