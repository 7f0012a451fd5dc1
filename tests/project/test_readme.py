"""The README is a short user guide: its contract block, its length, no dated measurements,
and every docs/ link it gives resolves. Also: no dated measurements in the package's and the
tests' docstrings and comments, and every test named in docs/reliability.md exists."""

import glob
import os
import re

from tests.helpers import dated_text

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
CONTRACT = [
    'pip install -e ".[dev]"',
    "python -m gpn_jax.train --config=experiments/configs/demo.py --workdir=runs/demo",
    "python -m pytest -q -n 2 tests",
]
# relative links to Markdown pages (a URL has a ":", so it is not matched)
_LINK = re.compile(r"\]\(([^)#\s:]+\.md)(?:#([^)\s]+))?\)")


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: str) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", _read(path), re.MULTILINE)}


def test_the_first_code_block_is_the_contract():
    first = re.search(r"```bash\n(.*?)```", _read(README), re.DOTALL)
    assert first and first.group(1).splitlines() == CONTRACT


def test_readme_is_at_most_300_lines():
    assert len(_read(README).splitlines()) <= 300


def test_readme_has_no_dates_times_or_commit_hashes():
    found = dated_text.dated(_read(README))
    assert not found, f"README.md: dated text {found}; measurements go to experiments/results/"


def test_every_docs_link_resolves():
    for page in [README, *glob.glob(os.path.join(ROOT, "docs", "*.md"))]:
        for target, anchor in _LINK.findall(_read(page)):
            path = os.path.normpath(os.path.join(os.path.dirname(page), target))
            assert os.path.isfile(path), f"{os.path.relpath(page, ROOT)} links to missing {target}"
            if anchor:
                assert anchor in _anchors(path), f"{target}#{anchor}: no such heading"


def test_every_section_after_the_install_links_to_its_docs_page():
    sections = re.split(r"^## ", _read(README), flags=re.MULTILINE)[1:]
    for section in sections:
        title = section.splitlines()[0]
        if title.startswith("Install"):
            continue
        assert "](docs/" in section, f"README section {title!r} links to no docs/ page"


def test_the_docs_pages_exist():
    for name in ("performance", "results", "reliability", "design"):
        assert os.path.isfile(os.path.join(ROOT, "docs", f"{name}.md")), name


def test_every_test_named_in_reliability_exists():
    text = _read(os.path.join(ROOT, "docs", "reliability.md"))
    named = set(re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", text))
    assert named
    missing = []
    for path, func in sorted(named):
        full = os.path.join(ROOT, path)
        if not os.path.isfile(full) or (
            func and not re.search(rf"^\s*def {func}\(", _read(full), re.MULTILINE)
        ):
            missing.append(f"{path}::{func}" if func else path)
    assert not missing, f"docs/reliability.md names tests that do not exist: {missing}"


def test_the_scan_finds_dates_and_cited_hashes():
    source = '"""Ran 2026-12-03 at 0330e2c."""\n# fine: 1e-3, 129151902, deadbeef\nx = 1  # commit a6e0148\n'
    assert sorted(dated_text.dated_prose(source)) == [
        (1, "2026-12-03"),
        (1, "at 0330e2c"),
        (3, "commit a6e0148"),
    ]
    assert dated_text.dated("peak 129151902 at 1e-3, word deadbeef") == []
    assert dated_text.dated("at 14:19 UTC") == ["14:19 UTC"]


def test_no_dated_measurements_in_docstrings_or_comments():
    files = glob.glob(os.path.join(ROOT, "gpn_jax", "**", "*.py"), recursive=True)
    files += glob.glob(os.path.join(ROOT, "tests", "**", "*.py"), recursive=True)
    hits = []
    for path in sorted(files):
        for line, token in dated_text.dated_prose(_read(path)):
            hits.append(f"{os.path.relpath(path, ROOT)}:{line}: {token}")
    assert not hits, "dated measurements in docstrings/comments:\n" + "\n".join(hits)
