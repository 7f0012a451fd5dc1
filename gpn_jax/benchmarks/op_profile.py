"""Where a profiled step's time went, operation by operation (`python -m gpn_jax.bench --profile`).

A `jax.profiler` trace of one XLA:CPU execution names each executed HLO instruction (thunk) but
not its shape or the loop it runs in, and nested events (a `while` and the operations of its
body) overlap. This module joins the trace with the step's optimised HLO text
(`compiled.as_text()`):

* **self time** per instruction: its events' durations minus those of the events nested in
  them on the same thread (so a loop's own time is its bookkeeping, not its body's);
* its **calls** (a body's operation runs once per trip), its result shape and opcode, and the
  `while` loops enclosing it, outermost first, each with its trip count when XLA knows it.

XLA:CPU may run independent operations at once on different threads, so self times can add up
to more than the step's wall time: read them as CPU time. Nothing here parses xprof's binary
protobufs: the trace's `.trace.json.gz` is what `jax.profiler.trace` writes next to them.
"""

import collections
import dataclasses
import glob
import json
import os
import re

from gpn_jax.io.regular import read_gzip

# A one-step trace, decompressed (parsed, it holds several times this).
MAX_TRACE_BYTES = 1 << 30
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.+?) ([a-z][\w\-]*)\(")
_BODY = re.compile(r"body=%?([\w.\-]+)")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_OP_NAME = re.compile(r'op_name="([^"]*)"')


@dataclasses.dataclass(frozen=True)
class Op:
    computation: str
    shape: str  # the result's type, e.g. f32[16,4872]{1,0}
    opcode: str  # fusion, dot, copy, while, ...


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    self_us: float
    calls: int
    shape: str
    opcode: str
    loops: tuple[str, ...]  # enclosing while loops, outermost first: "while.95 (x16)"


def hlo_ops(text: str) -> tuple[dict[str, Op], dict[str, tuple[str, str, str]]]:
    """(instruction name -> Op, body computation -> (its while instruction, trip count or '?',
    the while's JAX op_name or '')) from an optimised HLO module's text."""
    ops, bodies, comp = {}, {}, None
    for line in text.splitlines():
        m = _COMPUTATION.match(line)
        if m:
            comp = m.group(1)
            continue
        if line.startswith("}"):
            comp = None
            continue
        m = _INSTRUCTION.match(line)
        if m and comp is not None:
            name, shape, opcode = m.groups()
            ops[name] = Op(comp, shape.split(" ")[0], opcode)
            if opcode == "while":
                trips, op_name = _TRIPS.search(line), _OP_NAME.search(line)
                bodies[_BODY.search(line).group(1)] = (
                    name,
                    trips.group(1) if trips else "?",
                    op_name.group(1) if op_name else "",
                )
    return ops, bodies


def _loop_label(loop: str, trips: str) -> str:
    return f"{loop} (x{trips})"


def enclosing_loops(op: Op, ops: dict[str, Op], bodies: dict) -> tuple[str, ...]:
    """The while loops around `op`, outermost first (a body computation's loop is the while
    that names it; that while's own computation may be another loop's body)."""
    loops, comp = [], op.computation
    while comp in bodies:
        loop, trips, _ = bodies[comp]
        loops.insert(0, _loop_label(loop, trips))
        comp = ops[loop].computation
    return tuple(loops)


def self_times(events: list[dict]) -> tuple[dict[str, float], collections.Counter]:
    """(name -> self time in µs, name -> calls) of complete ('X') trace events: each event's
    duration less the durations of the events directly nested in it on its thread."""
    threads = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            threads[(e["pid"], e["tid"])].append(e)
    total, calls = collections.defaultdict(float), collections.Counter()
    for evs in threads.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_ = []
        for e in evs:
            while open_ and open_[-1]["ts"] + open_[-1]["dur"] <= e["ts"]:
                open_.pop()
            if open_:
                total[open_[-1]["name"]] -= e["dur"]
            total[e["name"]] += e["dur"]
            calls[e["name"]] += 1
            open_.append(e)
    return dict(total), calls


def trace_events(trace_dir: str) -> list[dict]:
    """The events of the newest `*.trace.json.gz` under `trace_dir` (a `jax.profiler.trace`
    directory); a clear error when there is none."""
    found = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    if not found:
        raise FileNotFoundError(f"no *.trace.json.gz under {trace_dir} (a jax.profiler trace)")
    newest = max(found, key=os.path.getmtime)
    return json.loads(read_gzip(newest, MAX_TRACE_BYTES))["traceEvents"]


def summarize(events: list[dict], hlo_text: str) -> list[Row]:
    """One row per HLO instruction of the module that the trace saw run, largest self time
    first (runtime events that are not instructions, e.g. the executor's, are left out)."""
    ops, bodies = hlo_ops(hlo_text)
    total, calls = self_times(events)
    rows = [
        Row(n, us, calls[n], ops[n].shape, ops[n].opcode, enclosing_loops(ops[n], ops, bodies))
        for n, us in total.items()
        if n in ops
    ]
    return sorted(rows, key=lambda r: -r.self_us)


def table(rows: list[Row], top: int = 25) -> str:
    """A markdown table of the `top` rows, with each one's share of all rows' self time."""
    whole = sum(r.self_us for r in rows) or 1.0
    lines = [
        f"Self time of the step's {len(rows)} executed operations: {whole / 1e3:.1f} ms "
        "(CPU time; threads may overlap).",
        "",
        "| operation | opcode | shape | calls | µs / call | ms total | share | inside |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows[:top]:
        lines.append(
            f"| {r.name} | {r.opcode} | {r.shape} | {r.calls} | {r.self_us / r.calls:.1f} | "
            f"{r.self_us / 1e3:.1f} | {100 * r.self_us / whole:.1f} % | "
            f"{' > '.join(r.loops) or '-'} |"
        )
    return "\n".join(lines) + "\n"


def loop_table(rows: list[Row], hlo_text: str) -> str:
    """Self time per innermost enclosing loop (or the step's top level), with each loop's JAX
    op_name (e.g. `.../transpose(jvp())/while`: a loop of the backward pass)."""
    names = {_loop_label(w, t): op for w, t, op in hlo_ops(hlo_text)[1].values()}
    per = collections.defaultdict(float)
    for r in rows:
        per[r.loops[-1] if r.loops else "top level"] += r.self_us
    whole = sum(per.values()) or 1.0
    lines = ["| inside | ms | share | JAX op_name |", "|---|---:|---:|---|"]
    for where, us in sorted(per.items(), key=lambda kv: -kv[1]):
        op = names.get(where, "")
        lines.append(f"| {where} | {us / 1e3:.1f} | {100 * us / whole:.1f} % | {op} |")
    return "\n".join(lines) + "\n"
