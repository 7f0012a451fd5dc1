"""`gpn_jax.benchmarks.op_profile`: a profiler trace joined with the step's optimised HLO."""

import gzip
import json
import os

import jax
import jax.numpy as jnp
import pytest

from gpn_jax.benchmarks import op_profile
from gpn_jax.io.regular import NotRegularFileError

HLO = """HloModule m

%inner_body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]{0}) parameter(0)
  %mul_fusion = f32[4]{0} fusion(%x), kind=kLoop, calls=%fc
  ROOT %t = (s32[], f32[4]{0}) tuple(%i, %mul_fusion)
}

%outer_body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]{0}) parameter(0)
  %while.2 = (s32[], f32[4]{0}) while(%p), condition=%c2, body=%inner_body, backend_config={"known_trip_count":{"n":"3"}}
  %dot.1 = f32[4,4]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = (s32[], f32[4]{0}) tuple(%i, %y)
}

ENTRY %main (a: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  %while.1 = (s32[], f32[4]{0}) while(%t0), condition=%c1, body=%outer_body, metadata={op_name="jit(f)/while"}
  ROOT %copy.9 = f32[4]{0} copy(%g)
}
"""


def ev(name, ts, dur, tid=1):
    return {"ph": "X", "pid": 0, "tid": tid, "ts": ts, "dur": dur, "name": name}


# one execution: the outer loop runs twice, its body's inner loop 3 times per trip
EVENTS = [
    ev("ThunkExecutor::Execute", 0, 100),
    ev("while.1", 1, 90),
    *[ev("while.2", 2 + 40 * k, 30) for k in range(2)],
    *[ev("mul_fusion", 3 + 40 * k + 9 * j, 6) for k in range(2) for j in range(3)],
    *[ev("dot.1", 33 + 40 * k, 7) for k in range(2)],
    ev("copy.9", 50, 7, tid=2),  # on another thread: overlaps the loop without nesting in it
    {"ph": "M", "pid": 0, "name": "process_name"},
]


def test_hlo_ops_and_loops():
    ops, bodies = op_profile.hlo_ops(HLO)
    assert ops["dot.1"] == op_profile.Op("outer_body", "f32[4,4]{1,0}", "dot")
    assert ops["while.2"].opcode == "while" and ops["copy.9"].computation == "main"
    assert bodies == {
        "inner_body": ("while.2", "3", ""),
        "outer_body": ("while.1", "?", "jit(f)/while"),
    }
    loops = op_profile.enclosing_loops(ops["mul_fusion"], ops, bodies)
    assert loops == ("while.1 (x?)", "while.2 (x3)")


def test_self_times_subtract_nested_events_on_the_same_thread():
    total, calls = op_profile.self_times(EVENTS)
    assert total["mul_fusion"] == 36 and calls["mul_fusion"] == 6
    assert total["while.2"] == 2 * (30 - 18) and calls["while.2"] == 2
    assert total["while.1"] == 90 - 60 - 14 and total["copy.9"] == 7
    assert total["ThunkExecutor::Execute"] == 10


def test_summary_rows_and_tables():
    rows = op_profile.summarize(EVENTS, HLO)
    assert [r.name for r in rows] == ["mul_fusion", "while.2", "while.1", "dot.1", "copy.9"]
    mul = rows[0]
    assert (mul.self_us, mul.calls, mul.shape) == (36, 6, "f32[4]{0}")
    assert mul.loops == ("while.1 (x?)", "while.2 (x3)")
    text = op_profile.table(rows, top=2)
    assert "executed operations: 0.1 ms" in text
    assert (
        "| mul_fusion | fusion | f32[4]{0} | 6 | 6.0 | 0.0 | 37.1 % | while.1 (x?) > while.2 (x3) |"
        in text
    )
    assert "dot.1" not in text  # top=2
    per_loop = op_profile.loop_table(rows, HLO)
    lines = per_loop.splitlines()[2:]  # largest first
    assert lines == [
        "| while.1 (x?) | 0.0 | 39.2 % | jit(f)/while |",
        "| while.2 (x3) | 0.0 | 37.1 % |  |",
        "| top level | 0.0 | 23.7 % |  |",
    ]


def test_missing_trace_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no \*\.trace\.json\.gz under "):
        op_profile.trace_events(str(tmp_path))


def test_a_real_profile_counts_each_loop_trip(tmp_path):
    """A jitted scan of 7 steps profiled on CPU: each operation of the loop body ran 7 times,
    inside the one while loop the compiled HLO has, whose trip count XLA knows."""

    @jax.jit
    def f(w, x):
        return jax.lax.scan(lambda s, _: (jnp.tanh(s @ w), None), x, None, length=7)[0]

    w, x = jnp.ones((64, 64)) / 64, jnp.ones((8, 64))
    compiled = f.lower(w, x).compile()
    jax.block_until_ready(compiled(w, x))
    with jax.profiler.trace(str(tmp_path)):
        jax.block_until_ready(compiled(w, x))
    rows = op_profile.summarize(op_profile.trace_events(str(tmp_path)), compiled.as_text())
    in_loop = [r for r in rows if r.loops]
    assert in_loop, [(r.name, r.loops) for r in rows]
    assert {r.loops for r in in_loop} == {(in_loop[0].loops[0],)}
    assert in_loop[0].loops[0].endswith("(x7)")
    assert all(r.calls == 7 for r in in_loop), [(r.name, r.calls) for r in in_loop]
    assert any(r.opcode == "while" and r.calls == 1 for r in rows)


def test_trace_events_reads_the_newest_trace(tmp_path):
    d = tmp_path / "plugins" / "profile" / "run"
    d.mkdir(parents=True)
    with gzip.open(d / "host.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": EVENTS}, f)
    assert op_profile.trace_events(str(tmp_path)) == EVENTS


def test_a_trace_that_is_no_regular_file_or_expands_past_the_cap_is_one_line(tmp_path, monkeypatch):
    """Read through gpn_jax/io (issue 83): a FIFO named like a trace is refused, not waited
    on; a trace that decompresses past the cap is refused before it is all held."""
    d = tmp_path / "plugins" / "profile" / "run"
    d.mkdir(parents=True)
    os.mkfifo(d / "host.trace.json.gz")
    with pytest.raises(NotRegularFileError, match=r"host\.trace\.json\.gz is a FIFO"):
        op_profile.trace_events(str(tmp_path))
    os.unlink(d / "host.trace.json.gz")
    with gzip.open(d / "host.trace.json.gz", "wt") as f:
        f.write(" " * (3 << 20) + json.dumps({"traceEvents": EVENTS}))
    monkeypatch.setattr(op_profile, "MAX_TRACE_BYTES", 2 << 20)
    with pytest.raises(NotRegularFileError, match=r"more than the 2097152 bytes expected"):
        op_profile.trace_events(str(tmp_path))
    monkeypatch.setattr(op_profile, "MAX_TRACE_BYTES", 4 << 20)
    assert op_profile.trace_events(str(tmp_path)) == EVENTS
