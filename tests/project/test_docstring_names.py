"""Docstrings name only what exists: every backticked reference in a gpn_jax docstring that
names a gpn_jax module (`core.fused.window`, `fused.window.scan_window_fused`,
`gpn_jax.eval.suite.run_evals`) names a module, a top-level name of it, or a class's member;
every backticked private name (`_write`) is defined somewhere in the package.

Parsed with `ast`; nothing is imported. References to other libraries (`jax.lax.scan`), config
fields (`model.kernels`) and file names (`hlo.txt`) do not name a gpn_jax module and are not
checked."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2] / "gpn_jax"
_TICKED = re.compile(r"`([^`\s]+)`")
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
_PRIVATE = re.compile(r"^_[a-z]\w*$")
_FILE_SUFFIXES = {"py", "txt", "json", "jsonl", "md", "cc", "h", "so", "npy", "pkl", "model"}
# Config blocks and objects whose names are also module basenames: `train.carry_state`,
# `data.train_layout`, `tokenizer.eos_id`, `stats.truncated` name fields, not modules.
NOT_MODULES = {"data", "train", "model", "mesh", "tokenizer", "stats"}
NOT_FUNCTIONS = {"_sharding"}  # an orbax checkpoint's file, named in the checkpoint docs
# The kernels' docstrings are being rewritten with their backends: they join this rule then.
PENDING: tuple[str, ...] = ()


def _module_name(path: pathlib.Path) -> str:
    parts = ["gpn_jax", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _members(tree: ast.Module) -> dict[str, set[str] | None]:
    """Top-level name -> its members (a class's attributes; None for anything else)."""
    out: dict[str, set[str] | None] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = {
                t.id if isinstance(t, ast.Name) else t.name
                for n in node.body
                for t in (
                    [n]
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                    else getattr(n, "targets", [getattr(n, "target", None)])
                )
                if isinstance(t, (ast.Name, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            }
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = None
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                out[(a.asname or a.name).split(".")[0]] = None
        else:
            for n in ast.walk(node):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    out[n.id] = None
                    if n.id == "_EXPORTS":  # a lazy package's names (PEP 562 `__getattr__`)
                        out.update({k.value: None for k in node.value.keys})
    return out


def _package():
    modules, defined, docs = {}, set(), []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        name = _module_name(path)
        modules[name] = _members(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.arg):
                defined.add(node.arg)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                defined.add(node.attr)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node)
                if doc:
                    docs.append((f"{name}:{getattr(node, 'name', '')}", doc))
    return modules, defined, docs


def _resolve(ref: str, modules: dict) -> str | None:
    """None if `ref` is fine (or names no gpn_jax module), else what is missing."""
    parts = ref.split(".")
    if parts[-1] in _FILE_SUFFIXES or parts[0] in NOT_MODULES:
        return None
    for i in range(len(parts), 0, -1):
        head, rest = ".".join(parts[:i]), parts[i:]
        found = [m for m in modules if m == head or m.endswith("." + head)]
        if not found:
            continue
        if not rest or any(f"{m}.{rest[0]}" in modules for m in found):
            return None
        for m in found:
            members = modules[m]
            if rest[0] in members:
                inner = members[rest[0]]
                if len(rest) == 1 or inner is None or rest[1] in inner:
                    return None
        return f"{head} has no {'.'.join(rest)}"
    return None


def test_backticked_names_in_docstrings_exist():
    modules, defined, docs = _package()
    bad = []
    for where, doc in docs:
        if where.startswith(PENDING):
            continue
        for ref in _TICKED.findall(doc):
            ref = ref.rstrip(".,:;").removesuffix("()")
            if _DOTTED.match(ref):
                missing = _resolve(ref, modules)
                if missing:
                    bad.append(f"{where}: `{ref}` ({missing})")
            elif _PRIVATE.match(ref) and ref not in defined | NOT_FUNCTIONS:
                bad.append(f"{where}: `{ref}` is defined nowhere in gpn_jax")
    assert not bad, "docstrings name what does not exist:\n" + "\n".join(bad)
