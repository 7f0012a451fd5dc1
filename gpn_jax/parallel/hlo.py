"""Reading compiled (optimised) HLO text: while loops and the collectives inside their bodies.

Used by the sharding tests and `gpn_jax.aot` to show that the recurrent scan's loop body
carries no weight all-gather / gradient reduce-scatter (each would run once per token).
A loop's body is taken with everything it calls (fusions, nested loops, calls, branches).
"""

import collections
import dataclasses
import re

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "collective-permute", "all-to-all")

_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(")
_OPCODE = re.compile(r"\s(" + "|".join(re.escape(c) for c in COLLECTIVES) + r")(?:-start)?\(")
_CALLED = re.compile(
    r"(?:calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)"
)
_CALLED_LIST = re.compile(r"(?:branch_computations|called_computations)=\{([^}]*)\}")
_WHILE = re.compile(r"\swhile\(.*?condition=%?([\w.\-]+),\s*body=%?([\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


@dataclasses.dataclass
class Loop:
    body: str
    condition: str
    trip_count: int | None  # None when XLA could not prove it
    collectives: collections.Counter  # opcode -> count, in the body and all it calls
    op_names: list  # the JAX op_name of each collective (for messages)


def computations(hlo: str) -> dict[str, list[str]]:
    """Computation name -> its instruction lines."""
    comps: dict[str, list[str]] = {}
    current = None
    for line in hlo.splitlines():
        if line and not line[0].isspace():
            m = _HEADER.match(line)
            current = m.group(1) if (m and line.rstrip().endswith("{")) else None
            if current:
                comps[current] = []
        elif current is not None:
            comps[current].append(line)
    return comps


def _callees(lines: list[str]) -> set[str]:
    out = set()
    for line in lines:
        out.update(_CALLED.findall(line))
        for group in _CALLED_LIST.findall(line):
            out.update(n.strip().lstrip("%") for n in group.split(",") if n.strip())
    return out


def reachable(comps: dict[str, list[str]], root: str) -> set[str]:
    seen, todo = set(), [root]
    while todo:
        name = todo.pop()
        if name in seen or name not in comps:
            continue
        seen.add(name)
        todo.extend(_callees(comps[name]))
    return seen


def collectives(comps: dict[str, list[str]], names) -> tuple[collections.Counter, list]:
    counts, where = collections.Counter(), []
    for name in names:
        for line in comps.get(name, []):
            m = _OPCODE.search(line)
            if m:
                counts[m.group(1)] += 1
                op = re.search(r'op_name="([^"]*)"', line)
                where.append(f"{m.group(1)}: {op.group(1) if op else line.strip()[:120]}")
    return counts, where


def while_loops(hlo: str) -> list[Loop]:
    """Every while loop of the module with the collectives in its body (and callees)."""
    comps = computations(hlo)
    loops = []
    for lines in comps.values():
        for line in lines:
            m = _WHILE.search(line)
            if not m:
                continue
            trip = _TRIP.search(line)
            counts, where = collectives(comps, reachable(comps, m.group(2)))
            loops.append(
                Loop(m.group(2), m.group(1), int(trip.group(1)) if trip else None, counts, where)
            )
    return loops


def entry_collectives(hlo: str) -> collections.Counter:
    """Collectives of the whole module (every computation)."""
    comps = computations(hlo)
    return collectives(comps, comps.keys())[0]
