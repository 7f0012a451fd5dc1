"""The one reader of compiled (optimised) HLO text: computations of parsed instructions, while
loops with their trip counts, and the collectives inside loop bodies.

`parse(text)` gives {computation name: [Instr]} and the entry computation's name; each `Instr`
has its name, opcode, result shape text, operand text and the rest of its line (`attrs`:
calls=, backend_config=, ...). Everything else reads that:

* the sharding tests and `gpn_jax.aot` show that the recurrent scan's loop body carries no
  weight all-gather / gradient reduce-scatter (each would run once per token): `while_loops`,
  with a loop's body taken with everything it calls (fusions, nested loops, calls, branches);
* `benchmarks.traffic` adds up the memory's HBM bytes over the same instructions.
"""

import collections
import dataclasses
import functools
import re

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "collective-permute", "all-to-all")

_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_CALLED = re.compile(
    r"(?:calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)"
)
_CALLED_LIST = re.compile(r"(?:branch_computations|called_computations)=\{([^}]*)\}")
_WHILE = re.compile(r"condition=%?([\w.\-]+),\s*body=%?([\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')
_OP_NAME = re.compile(r'op_name="([^"]*)"')


@dataclasses.dataclass
class Instr:
    name: str
    opcode: str
    result: str  # the result's shape text
    operands: str  # the text inside the opcode's parentheses
    attrs: str  # the rest of the line (calls=, backend_config=, ...)
    root: bool


@dataclasses.dataclass
class Loop:
    body: str
    trip_count: int | None  # None when XLA could not prove it
    collectives: collections.Counter  # opcode -> count, in the body and all it calls
    op_names: list  # the JAX op_name of each collective (for messages)


def _split_call(rest: str) -> tuple[str, str, str, str] | None:
    """'f32[2]{0} add(f32[2]{0} %a, ...), attrs' -> (result, opcode, operands, attrs)."""
    depth, i = 0, 0
    # the result shape ends where the opcode starts: the first word followed by '(' at depth 0
    while i < len(rest):
        ch = rest[i]
        if ch in "([{":
            if depth == 0 and ch == "(":
                m = re.search(r"([a-z][\w\-]*)$", rest[:i])
                if m and (i - len(m.group(1)) == 0 or rest[i - len(m.group(1)) - 1] == " "):
                    start = i - len(m.group(1))
                    close = _matching(rest, i)
                    return rest[:start].strip(), m.group(1), rest[i + 1 : close], rest[close + 1 :]
            depth += 1
        elif ch in ")]}":
            depth -= 1
        i += 1
    return None


def _matching(text: str, open_at: int) -> int:
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] in "([{":
            depth += 1
        elif text[j] in ")]}":
            depth -= 1
            if depth == 0:
                return j
    return len(text)


@functools.lru_cache(maxsize=4)
def parse(text: str) -> tuple[dict[str, list[Instr]], str | None]:
    """Computation name -> its instructions, and the entry computation's name. Cached: one
    compiled step's text is read by several analyses (`gpn_jax.aot` runs five); callers
    only read the result."""
    comps: dict[str, list[Instr]] = {}
    entry, current = None, None
    for line in text.splitlines():
        if line and not line[0].isspace():
            m = _HEADER.match(line)
            current = m.group(1) if (m and line.rstrip().endswith("{")) else None
            if current:
                comps[current] = []
                if line.startswith("ENTRY"):
                    entry = current
            continue
        if current is None:
            continue
        m = _INSTR.match(line)
        parts = _split_call(m.group(3)) if m else None
        if parts:
            result, opcode, operands, attrs = parts
            comps[current].append(
                Instr(m.group(2), opcode, result, operands, attrs, bool(m.group(1)))
            )
    return comps, entry


def computations(text: str) -> dict[str, list[Instr]]:
    """Computation name -> its instructions."""
    return parse(text)[0]


def while_parts(ins: Instr) -> tuple[str, str] | None:
    """(condition, body) of a `while` instruction, else None."""
    m = _WHILE.search(ins.attrs) if ins.opcode == "while" else None
    return (m.group(1), m.group(2)) if m else None


def known_trip_count(ins: Instr) -> int | None:
    """The trip count XLA proved for a `while` (its backend_config), or None."""
    m = _TRIP.search(ins.attrs)
    return int(m.group(1)) if m else None


def callees(ins: Instr) -> set[str]:
    """The computations `ins` calls (fusion, call, map / reduce, while, conditional)."""
    out = set(_CALLED.findall(ins.attrs))
    for group in _CALLED_LIST.findall(ins.attrs):
        out.update(n.strip().lstrip("%") for n in group.split(",") if n.strip())
    return out


def reachable(comps: dict[str, list[Instr]], root: str) -> set[str]:
    seen, todo = set(), [root]
    while todo:
        name = todo.pop()
        if name in seen or name not in comps:
            continue
        seen.add(name)
        for ins in comps[name]:
            todo.extend(callees(ins))
    return seen


def collective(ins: Instr) -> str | None:
    """The collective `ins` runs (its `-start` half for an asynchronous one), else None."""
    op = ins.opcode.removesuffix("-start")
    return op if op in COLLECTIVES else None


def collectives(comps: dict[str, list[Instr]], names) -> tuple[collections.Counter, list]:
    counts, where = collections.Counter(), []
    for name in names:
        for ins in comps.get(name, []):
            op = collective(ins)
            if op:
                counts[op] += 1
                m = _OP_NAME.search(ins.attrs)
                where.append(f"{op}: {m.group(1) if m else ins.name}")
    return counts, where


def while_loops(hlo: str) -> list[Loop]:
    """Every while loop of the module with the collectives in its body (and callees)."""
    comps = computations(hlo)
    loops = []
    for body in comps.values():
        for ins in body:
            parts = while_parts(ins)
            if parts is None:
                continue
            _, loop_body = parts  # (condition, body)
            counts, where = collectives(comps, reachable(comps, loop_body))
            loops.append(Loop(loop_body, known_trip_count(ins), counts, where))
    return loops
