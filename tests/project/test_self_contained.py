"""No project file names anything outside the repository: no design notes, style guides or
model contracts that only some checkouts have (`SPEC`, `STYLE.md`, `ARCHITECTURE.md`), no
machine paths of the workspace it was written in. What the code follows is written here
(README.md, docs/) or cited (the paper).

Python files are checked in their comments and strings (a variable may be called `SPEC`);
every other text file in full."""

import io
import pathlib
import re
import subprocess
import tokenize

REPO = pathlib.Path(__file__).resolve().parents[2]
OUTSIDE = re.compile(
    r"\bSPEC\b|\bSTYLE\.md\b|\bARCHITECTURE\.md\b|/work/(?:shared|wt|main)\b|\.\./shared/"
)
TEXT = {".md", ".cfg", ".toml", ".txt", ".ipynb", ".sh", ".sbatch", ".yaml", ".yml", ".cc", ".h"}
SKIP = {
    ".git",
    "experiments/results",
    "build",
    ".pytest_cache",
    "tests/project/test_self_contained.py",
}


def _project_files() -> list[str]:
    """The project's files: tracked or not ignored (`git ls-files`), so what a run writes into
    ignored folders (`runs/`, caches) is not the project's; every file without git."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO, capture_output=True, check=True, timeout=60,
        ).stdout  # fmt: skip
        return sorted(set(out.decode().split("\0")) - {""})
    except (OSError, subprocess.SubprocessError):
        return sorted(p.relative_to(REPO).as_posix() for p in REPO.rglob("*"))


def _files():
    for rel in _project_files():
        path = REPO / rel
        if path.is_file() and not any(rel == s or rel.startswith(s + "/") for s in SKIP):
            if path.suffix == ".py" or path.suffix in TEXT or path.name in ("run",):
                yield rel, path


def _prose(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, text) of what a reader reads: a Python file's comments and strings, else all."""
    text = path.read_text(errors="replace")
    if path.suffix != ".py":
        return list(enumerate(text.splitlines(), 1))
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return [(t.start[0], t.string) for t in tokens if t.type in (tokenize.COMMENT, tokenize.STRING)]


def test_no_file_names_anything_outside_the_repository():
    bad = [
        f"{rel}:{line}: {OUTSIDE.search(s).group(0)!r}"
        for rel, path in _files()
        for line, s in _prose(path)
        if OUTSIDE.search(s)
    ]
    assert not bad, "names outside the repository (write it here, or cite it):\n" + "\n".join(bad)
