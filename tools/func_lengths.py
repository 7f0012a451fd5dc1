"""Lists functions longer than a limit (default 60 lines), longest first.

    python tools/func_lengths.py [--limit 60] [paths ...]   (default paths: gpn_jax experiments)

A function's length is from its `def` line to its last line (docstring and comments
included); nested functions count inside their parent and on their own. Not a test: a
guide for keeping functions short.
"""

import argparse
import ast
import pathlib


def lengths(path: pathlib.Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.end_lineno - node.lineno + 1, f"{path}:{node.lineno}", node.name


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=["gpn_jax", "experiments"])
    parser.add_argument("--limit", type=int, default=60)
    args = parser.parse_args()
    files = []
    for p in map(pathlib.Path, args.paths):
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    rows = sorted((r for f in files for r in lengths(f) if r[0] > args.limit), reverse=True)
    for n, where, name in rows:
        print(f"{n:5d}  {where}  {name}")
    print(f"{len(rows)} function(s) over {args.limit} lines")


if __name__ == "__main__":
    main()
