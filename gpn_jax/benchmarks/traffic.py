"""HBM traffic over the GPN+M memory, read off a compiled step's optimised HLO, and its minimum.

`hlo_bytes(text, elements)` walks the module from its entry computation and adds up the bytes
of every array of exactly `elements` elements (the per-device memory (B_local, H, K, U) and any
array of the same size, in any dtype) that an instruction reads or writes in device memory:

- a fusion, custom call or other data-moving instruction counts each distinct operand once and
  each result once (the inside of a fusion stays on chip: it is not walked);
- a custom call (a kernel) handed a stack of such arrays as an operand counts one of them: the
  memory kernels' backward passes (C++, Triton, Mosaic) take the recomputed stack Ms and read
  the one step t they index; a stack a kernel returns (the recomputation's Ms) counts in full;
- an in-place update (a `dynamic-update-slice`, or a fusion whose root is one) does not count
  the buffer it updates, only what it writes into it and its other operands;
- `copy-start` counts what it reads, `copy-done` what it writes (asynchronous copies between
  memory spaces);
- an array whose layout names a memory space other than 0 (`S(1)`: VMEM on TPU) moves no
  HBM bytes;
- a while loop's body and condition count `known_trip_count` times (from the loop's
  backend_config; else the one integer constant its condition compares with; else once, and
  the loop is reported in `unknown_trip_counts`), a conditional its costliest branch, a call
  its callee;
- shape plumbing (`parameter`, `constant`, `get-tuple-element`, `tuple`, `bitcast`,
  `opt-barrier`, ...) moves nothing.

`min_bytes_per_token(...)` is the analytic minimum of the fused window's schedule per token,
per memory cell, with m the storage dtype's bytes (`model.memory_dtype`), for where the compiled
step holds the memory between tokens (`placement`: read off its per-token loops' carries):

    memory in HBM between tokens (every GPU and CPU compile; TPU where M does not fit VMEM)
    forward                  read M_{t-1}, write M_t                          2m
    backward recomputation   read M_{t-1}, write M_t (from the segment start) 2m
    backward per-token pass  read M_t; read + write the float32 cotangent     m + 8
                                                                       total  5m + 8

    the same where the backward has every step's write inputs before it rebuilds the memory
    (no remat, or `remat_parallel`): the recomputation carries M on chip through the segment
    backward recomputation   write M_t into the segment's stack               m
                                                                       total  4m + 8

    memory (and its cotangent) on chip between tokens (XLA:TPU's VMEM, `S(1)`)
    forward                  nothing: M_t stays on chip                       0
    backward recomputation   write M_t into the segment's stack               m
    backward per-token pass  read M_t from the stack                          m
                                                                       total  2m

i.e. 28 bytes per cell in float32 storage, 18 in bfloat16 (4m + 8: 24 and 16; 2m: 8 and 4), and 0 where the
segment's stack of memories stays on chip too (tiny sizes); times H x K x U cells per token.
The HBM-resident minimum is no floor for a step that keeps M in VMEM: XLA:TPU does so at the
per-chip batches whose memory fits, and its count then falls below 5m + 8.
"""

import dataclasses
import math
import re

from gpn_jax.models import factory
from gpn_jax.parallel import hlo
from gpn_jax.parallel.hlo import Instr

DTYPE_BYTES = {
    "pred": 1,
    "s4": 1,
    "u4": 1,
    "s8": 1,
    "u8": 1,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
FREE = {
    "parameter",
    "constant",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "opt-barrier",
    "after-all",
    "partition-id",
    "replica-id",
    "iota",
}
CONTROL = {"while", "call", "conditional"}  # move nothing themselves: their bodies count
SHAPE = re.compile(r"\b(" + "|".join(DTYPE_BYTES) + r")\[([\d,]*)\](\{[^}]*\})?")
_CALLS = re.compile(r"(?:calls|to_apply)=%?([\w.\-]+)")
_BRANCHES = re.compile(
    r"(?:branch_computations=\{([^}]*)\}|true_computation=%?([\w.\-]+)|false_computation=%?([\w.\-]+))"
)
_INT_SCALAR = re.compile(r"^[su](?:8|16|32|64)\[\]")
_MEMSPACE = re.compile(r"S\((\d+)\)")


@dataclasses.dataclass
class Traffic:
    bytes: int  # HBM bytes over arrays of the asked size, loops multiplied out
    unknown_trip_counts: list  # loop bodies counted once because no trip count was found


def arrays(shape_text: str, elements: int) -> list[tuple[int, int]]:
    """(multiple, HBM bytes) of each array in `shape_text` whose element count is a multiple
    of `elements` (1: M-sized; k > 1: a stack of k such arrays). An array in a memory space
    other than 0 (`S(1)`: VMEM on TPU) has 0 HBM bytes."""
    out = []
    for dtype, dims, layout in SHAPE.findall(shape_text):
        n = math.prod(int(d) for d in dims.split(",")) if dims else 1
        if n == 0 or n % elements:
            continue
        space = _MEMSPACE.search(layout or "")
        hbm = not (space and space.group(1) != "0")
        out.append((n // elements, n * DTYPE_BYTES[dtype] if hbm else 0))
    return out


def array_bytes(shape_text: str, elements: int) -> int:
    """HBM bytes of the M-sized arrays (exactly `elements` elements) in `shape_text`."""
    return sum(b for k, b in arrays(shape_text, elements) if k == 1)


def _operand_list(operands: str) -> list[str]:
    """Top-level comma-separated operands, each once (by its name)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(operands):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(operands[start:i])
            start = i + 1
    parts.append(operands[start:])
    seen, out = set(), []
    for p in (p.strip() for p in parts):
        key = p.split()[-1] if p else p
        if p and key not in seen:
            seen.add(key)
            out.append(p)
    return out


def _users(body: list[Instr], name: str) -> list[Instr]:
    pat = re.compile(r"%" + re.escape(name) + r"(?![\w.\-])")
    return [i for i in body if pat.search(i.operands)]


def _first_operand_is(ins: Instr, name: str) -> bool:
    ops = _operand_list(ins.operands)
    return bool(ops) and ops[0].split()[-1].lstrip("%") == name


def _param_bytes(body: list[Instr], index: int, outer: str, elements: int) -> int:
    """Bytes a fusion reads of its operand `index` (shape text `outer`): a stack that the
    fusion only slices (or updates in place) counts the M-sized slices it reads."""
    found = arrays(outer, elements)
    if not found or not any(b for _, b in found):
        return 0
    if found[0][0] == 1 or not body:
        return sum(b for _, b in found)
    param = next((i for i in body if i.opcode == "parameter" and i.operands == str(index)), None)
    users = _users(body, param.name) if param else []
    if users and all(
        u.opcode in ("dynamic-slice", "dynamic-update-slice") and _first_operand_is(u, param.name)
        for u in users
    ):
        per = found[0][1] // found[0][0]  # one M-sized slice of the stack, in its dtype
        return sum(per for u in users if u.opcode == "dynamic-slice" and arrays(u.result, elements))
    return sum(b for _, b in found)


def _fused_body(ins: Instr, comps: dict) -> list[Instr]:
    callee = _CALLS.search(ins.attrs) if ins.opcode == "fusion" else None
    return comps.get(callee.group(1), []) if callee else []


def _result_bytes(ins: Instr, body: list[Instr], elements: int) -> int:
    """Bytes written: a stack updated in place counts the M-sized slice written into it."""
    root = next((i for i in body if i.root), None)
    in_place = ins.opcode == "dynamic-update-slice" or (
        root is not None and root.opcode == "dynamic-update-slice"
    )
    total = 0
    for k, b in arrays(ins.result, elements):
        total += b if (k == 1 and not in_place) else (b // k if in_place else b)
    return total


def _shape_of(operand: str, shapes: dict) -> str:
    """An operand's shape text: printed with it, or its definition's in the computation."""
    if SHAPE.search(operand):
        return operand
    return shapes.get(operand.split()[-1].lstrip("%"), "")


def instruction_bytes(ins: Instr, comps: dict, elements: int, shapes: dict) -> int:
    """HBM bytes over M-sized arrays (`elements` elements) that one execution of `ins` moves;
    `shapes`: name -> result shape of the instructions of its computation."""
    if ins.opcode in FREE or ins.opcode in CONTROL:
        return 0  # control flow passes its buffers on; what its computations move counts
    if ins.opcode.endswith("-done"):
        return array_bytes(ins.result, elements) if ins.opcode == "copy-done" else 0
    operands = [_shape_of(o, shapes) for o in _operand_list(ins.operands)]
    if ins.opcode.endswith("-start"):
        return sum(array_bytes(o, elements) for o in operands) if ins.opcode == "copy-start" else 0
    if ins.opcode == "dynamic-slice":
        return 2 * array_bytes(ins.result, elements)  # reads the slice, writes the result
    if ins.opcode == "custom-call":
        reads = [sum(b // k for k, b in arrays(o, elements)) for o in operands]
        return sum(reads) + _result_bytes(ins, [], elements)
    body = _fused_body(ins, comps)
    reads = [_param_bytes(body, j, o, elements) for j, o in enumerate(operands)]
    root = next((i for i in body if i.root), None)
    if ins.opcode == "dynamic-update-slice" or (root and root.opcode == "dynamic-update-slice"):
        reads[:1] = [0] * len(reads[:1])  # the buffer updated in place: neither read nor copied
    return sum(reads) + _result_bytes(ins, body, elements)


def trip_count(ins: Instr, comps: dict, cond: str) -> int | None:
    """A while loop's trip count: XLA's `known_trip_count`, else the one integer constant its
    condition compares with; None when neither says."""
    known = hlo.known_trip_count(ins)
    if known is not None:
        return known
    consts = {
        int(c.operands)
        for c in comps.get(cond, [])
        if c.opcode == "constant"
        and _INT_SCALAR.match(c.result)
        and c.operands.lstrip("-").isdigit()
    }
    return consts.pop() if len(consts) == 1 else None


def hlo_bytes(text: str, elements: int, every_array: bool = False) -> Traffic:
    """HBM bytes that the module in `text` moves over arrays of `elements` elements, or with
    `every_array` over all its arrays (`op_bytes`)."""
    comps, entry = hlo.parse(text)
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    unknown, memo = [], {}

    def cost(name: str, stack: tuple) -> int:
        if name in memo:
            return memo[name]
        if name in stack or name not in comps:
            return 0
        total, shapes = 0, {i.name: i.result for i in comps[name]}
        for ins in comps[name]:
            count = op_bytes if every_array else instruction_bytes
            total += count(ins, comps, elements, shapes)
            total += _nested(ins, name, stack + (name,))
        memo[name] = total
        return total

    def _nested(ins: Instr, name: str, stack: tuple) -> int:
        if ins.opcode == "while":
            parts = hlo.while_parts(ins)
            if not parts:
                return 0
            cond, body = parts
            trip = trip_count(ins, comps, cond)
            if trip is None:
                unknown.append(body)
                trip = 1
            return trip * (cost(body, stack) + cost(cond, stack))
        if ins.opcode == "call":
            m = _CALLS.search(ins.attrs)
            return cost(m.group(1), stack) if m else 0
        if ins.opcode == "conditional":
            names = []
            for group, t, f in _BRANCHES.findall(ins.attrs):
                names += [n.strip().lstrip("%") for n in group.split(",") if n.strip()] + [t, f]
            return max((cost(n, stack) for n in names if n), default=0)
        return 0

    total = cost(entry, ())
    return Traffic(total, unknown)


def _field(cfg, name: str, default):
    """A model config's field: ConfigDict / dict (`.get`) or a dataclass (attribute)."""
    if hasattr(cfg, "get"):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


def memory_cells(model_cfg) -> int:
    """H x K x U of a GPN+M model config, a block or a built model's (0 for a model without
    the matrix memory)."""
    cfg = factory.family_config(model_cfg) if hasattr(model_cfg, "get") else model_cfg
    return getattr(cfg, "memory_cells", 0)


def loop_carries(text: str, elements: int, innermost: bool = True) -> list[tuple[int, bool]]:
    """(multiple, on chip) of each array a while loop of the module in `text` carries whose
    element count is a multiple of `elements` (1: the memory, k > 1: a stack of k memories);
    `innermost`: only the loops whose body runs no loop (the per-token loops)."""
    comps, _ = hlo.parse(text)
    found = []
    for instrs in comps.values():
        for ins in instrs:
            parts = hlo.while_parts(ins)
            if parts is None or (
                innermost and any(i.opcode == "while" for i in comps.get(parts[1], []))
            ):
                continue
            found += [(k, b == 0) for k, b in arrays(ins.result, elements)]
    return found


def placement(text: str, elements: int) -> tuple[bool, bool]:
    """(memory on chip, stack on chip) of a compiled step: whether a per-token loop carries
    the memory (`elements` elements) in on-chip memory, and whether the stacks of memories its
    per-token loops carry are all on chip too."""
    carried = loop_carries(text, elements)
    stacks = [on_chip for k, on_chip in carried if k > 1]
    memory = any(on_chip for k, on_chip in carried if k == 1)
    return memory, memory and bool(stacks) and all(stacks)


def min_bytes_per_cell(
    memory_dtype: str, on_chip: tuple[bool, bool] = (False, False), reruns_memory: bool = True
) -> int:
    """The module docstring's minimum per memory cell per token: 5m + 8 with the memory in
    HBM between tokens and rerun token by token (4m + 8 where it is not, `reruns_memory`);
    2m with it on chip (`placement`); 0 with its stack on chip too."""
    m = {"float32": 4, "bfloat16": 2}[str(memory_dtype)]
    memory, stack = on_chip
    if not memory:
        return (5 if reruns_memory else 4) * m + 8
    return 0 if stack else 2 * m


def reruns_memory(model_cfg) -> bool:
    """Whether the backward reruns the memory token by token: remat segments rerun one step at
    a time (`remat_segment` without `remat_parallel`)."""
    remat = bool(_field(model_cfg, "remat_segment", 0))
    return remat and not _field(model_cfg, "remat_parallel", False)


def min_bytes_per_token(model_cfg, on_chip: tuple[bool, bool] = (False, False)) -> int | None:
    """The analytic minimum of the memory's HBM traffic per token (None without a memory),
    for the memory's `placement` in the compiled step (default: in HBM) and the backward's
    schedule (`reruns_memory`)."""
    cells = memory_cells(model_cfg)
    if not cells:
        return None
    dtype = _field(model_cfg, "memory_dtype", "float32")
    return cells * min_bytes_per_cell(dtype, on_chip, reruns_memory(model_cfg))


def step_fields(model_cfg, hlo_text: str, batch_local: int, seq_len: int) -> dict:
    """The two traffic fields of a compiled step whose device holds `batch_local` sequences
    of `seq_len` tokens (one micro-batch): the HLO count and the minimum, bytes per token."""
    cells = memory_cells(model_cfg)
    if not cells:
        return {"memory_bytes_per_token_hlo": None, "memory_bytes_per_token_min": None}
    t = hlo_bytes(hlo_text, batch_local * cells)
    on_chip = placement(hlo_text, batch_local * cells)
    return {
        "memory_bytes_per_token_hlo": t.bytes / (batch_local * seq_len),
        "memory_bytes_per_token_min": min_bytes_per_token(model_cfg, on_chip),
        "unknown_trip_counts": t.unknown_trip_counts,
    }


def op_bytes(ins: Instr, comps: dict, elements: int, shapes: dict) -> int:
    """HBM bytes one execution of `ins` moves over all its arrays, not only the memory's: the
    rules of `instruction_bytes` (a fusion's parameter that it only slices counts the slices,
    a buffer updated in place counts what is written into it) with every array counted, a
    stack of `elements`-sized memories handed to a kernel counting the one step it indexes,
    and a cuBLAS workspace nothing. An asynchronous op counts at its start."""
    if ins.opcode in FREE or ins.opcode in CONTROL:
        return 0
    if ins.opcode.endswith("-done"):
        return _bytes(ins.result) if ins.opcode == "copy-done" else 0
    if ins.opcode.endswith("-start"):
        called = _CALLS.search(ins.attrs)
        inner = comps.get(called.group(1), []) if called else []
        root = next((i for i in inner if i.root), None)
        if root is None:  # copy-start and its kind: what it reads
            return sum(_bytes(_shape_of(o, shapes)) for o in _operand_list(ins.operands))
        return op_bytes(root, comps, elements, {i.name: i.result for i in inner})
    operands = [_shape_of(o, shapes) for o in _operand_list(ins.operands)]
    if ins.opcode == "dynamic-slice":
        return 2 * _bytes(ins.result)
    if ins.opcode == "dynamic-update-slice":
        return 2 * _bytes(operands[1]) if len(operands) > 1 else 0
    if ins.opcode == "custom-call":
        reads = sum(_bytes(o, one_of=elements) for o in operands)
        workspace = "cublas" in ins.attrs  # its result: (product, s8 workspace)
        return reads + _bytes(ins.result, skip="s8" if workspace else None)
    body = _fused_body(ins, comps)
    if not body:
        return sum(_bytes(o) for o in operands) + _bytes(ins.result)
    inner = {i.name: i for i in body}
    reads = sum(_fused_read(body, j, o) for j, o in enumerate(operands))
    root = next((i for i in body if i.root), None)
    if root is None:  # no ROOT marked: the fusion's result as written
        return reads + _bytes(ins.result)
    outs = _operand_list(root.operands) if root.opcode == "tuple" else [root.name]
    body_shapes = {name: i.result for name, i in inner.items()}
    written = 0
    for name in outs:
        out = inner.get(name.split()[-1].lstrip("%"))
        if out is not None and out.opcode == "dynamic-update-slice":
            update = _operand_list(out.operands)[1]
            written += _bytes(_shape_of(update, body_shapes))
        elif out is not None:
            written += _bytes(out.result)
    return reads + written


def _bytes(shape_text: str, one_of: int = 0, skip: str | None = None) -> int:
    """HBM bytes of every array in `shape_text` (0 in a memory space other than 0) but those
    of dtype `skip`; with `one_of`, a stack of k > 1 arrays of `one_of` elements counts one."""
    if skip:
        shape_text = " ".join(m.group(0) for m in SHAPE.finditer(shape_text) if m.group(1) != skip)
    total = 0
    for n, b in arrays(shape_text, 1):
        stack = one_of and n > one_of and n % one_of == 0
        total += b // (n // one_of) if stack else b
    return total


def _fused_read(body: list[Instr], index: int, outer: str) -> int:
    """Bytes a fusion reads of its operand `index`: the slices where it only slices it
    (statically or at a dynamic offset, through bitcasts), none where it only updates it in
    place, else all of it."""
    param = next((i for i in body if i.opcode == "parameter" and i.operands == str(index)), None)
    if param is None:
        return _bytes(outer)
    users = _slicing_users(body, param.name)
    if users and all(u.opcode == "dynamic-update-slice" for u in users):
        return 0
    return _sliced(body, param.name, _bytes(outer))


def _sliced(body: list[Instr], name: str, whole: int) -> int:
    """Bytes read of value `name` (`whole` bytes) in a fused body: what its slices read, a
    slice of a slice counting the inner one, where it is only sliced; else all of it."""
    users = _slicing_users(body, name)
    if not users or any(u.opcode not in ("slice", "dynamic-slice") for u in users):
        return whole
    return min(whole, sum(_sliced(body, u.name, _bytes(u.result)) for u in users))


def _slicing_users(body: list[Instr], name: str) -> list[Instr]:
    """The users of `name` in a fused body, through bitcasts, each taking it first (else
    []: the value is read whole)."""
    out = []
    for u in _users(body, name):
        if not _first_operand_is(u, name):
            return []
        if u.opcode == "bitcast":
            inner = _slicing_users(body, u.name)
            if not inner:
                return []
            out += inner
        else:
            out.append(u)
    return out
