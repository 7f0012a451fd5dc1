"""Finds dated measurements in source text: ISO dates, UTC times and commit-hash-like tokens.

Used by tests/project/test_readme.py on the README and on the docstrings and comments of the package and
the tests. Data only: files are read as text, parsed with `ast` / `tokenize`, never imported.
"""

import ast
import io
import re
import tokenize

ISO_DATE = re.compile(r"\b(19|20)\d\d-[01]\d-[0-3]\d\b")
UTC_TIME = re.compile(r"\b[0-2]?\d:[0-5]\d(:[0-5]\d)?\s*UTC\b|\bUTC\b")
# 7-40 hex digits with at least one digit and one letter (plain numbers and words are not hashes)
HASH = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
# a hash-like token right after "at", "commit" or "commits" (how the old log cited revisions)
CITED_HASH = re.compile(r"\b(?:at|commits?|revision)\s+(?:`)?" + HASH.pattern, re.IGNORECASE)


def dated(text: str) -> list[str]:
    """What in `text` is an ISO date, a UTC time or a commit-hash-like token."""
    found = [m.group(0) for m in ISO_DATE.finditer(text)]
    found += [m.group(0) for m in UTC_TIME.finditer(text)]
    found += [m.group(0) for m in HASH.finditer(text)]
    return found


def prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring in a Python source."""
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                out.append((tok.start[0], tok.string))
        tree = ast.parse(source)
    except (SyntaxError, tokenize.TokenError):
        return out
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc and node.body:
                out.append((node.body[0].lineno, doc))
    return out


def dated_prose(source: str) -> list[tuple[int, str]]:
    """(line, token) of each ISO date or cited commit hash in a source's comments and docstrings."""
    hits = []
    for line, text in prose(source):
        hits += [(line, m.group(0)) for m in ISO_DATE.finditer(text)]
        hits += [(line, m.group(0)) for m in CITED_HASH.finditer(text)]
    return hits
