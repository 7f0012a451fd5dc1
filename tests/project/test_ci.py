"""`.ci/run` runs the README's first ```bash block, so CI runs exactly what a newcomer runs.

Both sides are parsed: the README's first ```bash block here in Python, and what `.ci/run`
extracts from it (`.ci/run --print`); they must agree line for line, and the block must hold the
install of `[dev]`, the main job and the test command.
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
CI = ROOT / ".ci" / "run"


def readme_block(text: str) -> list[str]:
    """The lines of the first ```bash fenced block of a Markdown text."""
    match = re.search(r"^```bash[ \t]*\n(.*?)^```", text, re.S | re.M)
    assert match, "README.md has no ```bash block"
    return [line for line in match.group(1).splitlines() if line.strip()]


def run_ci(folder: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(folder / ".ci" / "run"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )


def test_ci_runs_the_readmes_first_bash_block():
    block = readme_block((ROOT / "README.md").read_text())
    printed = run_ci(ROOT, "--print")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.splitlines() == block


def test_the_readmes_block_installs_dev_runs_the_main_job_and_the_tests():
    block = readme_block((ROOT / "README.md").read_text())
    assert block[0] == 'pip install -e ".[dev]"'
    assert any(
        line.startswith("python -m gpn_jax.train --config=experiments/configs/demo.py")
        for line in block
    )
    assert block[-1].startswith("python -m pytest") and block[-1].endswith(" tests")


def test_ci_installs_nothing_the_readme_does_not():
    code = [line.split("#")[0] for line in CI.read_text().splitlines()]
    installs = [line for line in code if re.search(r"-m pip\b|\bpip3? install\b", line)]
    assert not installs, f"install in the README's block, not in .ci/run: {installs}"
    assert any(line.strip() == "ruff check ." for line in code)
    assert any(line.strip() == "ruff format --check ." for line in code)


def _checkout(tmp_path: pathlib.Path, readme: str) -> pathlib.Path:
    (tmp_path / ".ci").mkdir(parents=True)
    shutil.copy(CI, tmp_path / ".ci" / "run")
    (tmp_path / "README.md").write_text(readme)
    return tmp_path


def test_pytest_collecting_nothing_fails_ci(tmp_path):
    (tmp_path / "tests").mkdir()
    cmd = f"{sys.executable} -m pytest -q -p no:cacheprovider tests"
    folder = _checkout(tmp_path, f"# x\n\n```bash\n{cmd}\n```\n\n```bash\nexit 0\n```\n")
    result = run_ci(folder)
    assert result.returncode == 5, (result.stdout, result.stderr)


def test_a_readme_without_the_block_is_a_one_line_error(tmp_path):
    result = run_ci(_checkout(tmp_path, "# x\n\n```python\nprint(1)\n```\n"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        ".ci/run: README.md has no ```bash block; its first one must hold the install, "
        "main-job and test commands"
    ]
    result = run_ci(_checkout(tmp_path / "b", "```bash\necho hi\n```\n"))
    assert result.returncode == 2 and "runs no pytest command" in result.stderr
