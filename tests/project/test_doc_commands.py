"""Every command the README, docs/, launch/ and the entry points' --help texts show runs as
written, as far as its flags and paths go: parsed, not run.

Each command of an entry point (`python -m gpn_jax.X`, `python -m experiments.X`, a `gpn-*`
console script, and the launch scripts, which hand their flags to `gpn_jax.train`) is taken from
the code blocks and inline code of the pages and from the entry points' docstrings (what --help
prints). Each flag must be one that entry point really defines (its `--helpfull`, so absl's own
flags and flags declared when the command runs count), each `--config=FILE[:arg]` must exist and
each `--config.a.b=...` override must name a field of that config. Paths into the repository
(experiments/, launch/, tools/) must exist. Also: the Data line of a table from a transcribed
result file says so, and the README states no timings.
"""

import configparser
import functools
import glob
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = [
    "README.md",
    *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))),
    "launch/README.md",
]
# the launch scripts run gpn_jax.train with the flags that follow them
LAUNCHERS = {
    "launch/tpu_vm.sh": "gpn_jax.train",
    "launch/gpu_single_node.sh": "gpn_jax.train",
    "launch/slurm_multinode.sbatch": "gpn_jax.train",
}
_BLOCK = re.compile(r"```[a-z]*\n(.*?)```", re.DOTALL)
_INLINE = re.compile(r"`((?:python3? -m |gpn-)[^`]+)`")
_REPO_PATH = re.compile(
    r"(?<![\w/.$])((?:experiments|launch|tools)/[\w./$*-]+\.(?:py|sh|sbatch|ipynb))"
)


def _read(rel: str) -> str:
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def _console_scripts() -> dict[str, str]:
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    lines = cfg["options.entry_points"]["console_scripts"].strip().splitlines()
    return {n.strip(): t.split(":")[0].strip() for n, t in (ln.split("=", 1) for ln in lines)}


def _command_lines(text: str) -> list[str]:
    """Shell lines of the code blocks (continuations joined) and inline commands."""
    lines = []
    for block in _BLOCK.findall(text):
        lines += re.sub(r"\\\n\s*", " ", block).splitlines()
    return lines + _INLINE.findall(text)


def _entry(words: list[str]) -> tuple[str, list[str]] | None:
    """(module, its arguments) of a command line that runs an entry point, or None."""
    scripts = _console_scripts()
    for i, w in enumerate(words):
        if w in ("python", "python3") and words[i + 1 : i + 2] == ["-m"] and len(words) > i + 2:
            module = words[i + 2]
            if module.startswith(("gpn_jax.", "experiments.")):
                return module, words[i + 3 :]
        if w in scripts:
            return scripts[w], words[i + 1 :]
        if w in LAUNCHERS:
            args = words[i + 1 :]
            if w.endswith("tpu_vm.sh"):  # only its `train` subcommand runs the trainer
                if args[:1] != ["train"]:
                    return None
                args = args[1:]
            return LAUNCHERS[w], args
    return None


def _commands() -> list[tuple[str, str, str, list[str]]]:
    """(where, the line, module, arguments) of every entry-point command shown anywhere."""
    texts = {rel: _read(rel) for rel in PAGES}
    for module in sorted(set(_console_scripts().values()) | _experiment_entries()):
        path = module.replace(".", "/") + ".py"
        if os.path.exists(os.path.join(ROOT, path)):  # --help prints the module's docstring
            texts[f"{path} (--help)"] = _docstring(path)
    found = []
    for where, text in texts.items():
        for line in _command_lines(text):
            line = line.split(" # ")[0].strip()
            try:
                words = shlex.split(line)
            except ValueError:
                continue
            entry = _entry(words)
            if entry:
                found.append((where, line, *entry))
    return found


def _experiment_entries() -> set[str]:
    return {
        "experiments." + os.path.basename(p)[:-3]
        for p in glob.glob(os.path.join(ROOT, "experiments", "*.py"))
        if "app.run(" in _read(p) or "absl_entry(" in _read(p)
    }


def _docstring(rel: str) -> str:
    import ast

    doc = ast.get_docstring(ast.parse(_read(rel))) or ""
    # a docstring's indented example is a code block of its --help text
    return "```\n" + "\n".join(ln.strip() for ln in doc.splitlines()) + "\n```"


COMMANDS = _commands()


@functools.cache
def _flags(module: str) -> frozenset[str]:
    """The flags `python -m module` defines, read from its own --helpfull (absl), or --help
    (argparse: lm-eval's CLI behind gpn_jax.harness)."""
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}

    def help_text(flag):
        out = subprocess.run(
            [sys.executable, "-m", module, flag],
            capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
        )  # fmt: skip
        return out.stdout + out.stderr

    names = set()
    for no, name in re.findall(r"^\s+--(\[no\])?([\w.-]+):", help_text("--helpfull"), re.M):
        names |= {name, f"no{name}"} if no else {name}
    if not names:
        text = help_text("--help")
        assert "usage:" in text, f"{module} --help: {text[-500:]}"
        names = set(re.findall(r"(?<![\w-])--([A-Za-z][\w.-]*)", text))
    assert names, f"{module}: its help lists no flags"
    return frozenset(names)


@pytest.fixture(scope="module")
def entry_flags():
    modules = sorted({module for _, _, module, _ in COMMANDS})
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(modules, pool.map(_flags, modules), strict=True))


def _load_config(path: str, arg: str | None):
    spec = importlib.util.spec_from_file_location("_doc_config", os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()


def _config_file(value: str) -> tuple[str, str | None]:
    path, _, arg = value.partition(":")
    return path, arg or None


def _has_field(config, dotted: str) -> bool:
    node = config
    for part in dotted.split("."):
        try:
            node = node[part]
        except (KeyError, TypeError, AttributeError):
            return False
    return True


def _expand(path: str) -> list[str]:
    """A path as written, a shell variable standing for any part of the name."""
    return glob.glob(os.path.join(ROOT, re.sub(r"\$\{?\w+\}?", "*", path)))


def test_the_commands_are_found():
    modules = {module for _, _, module, _ in COMMANDS}
    assert {"gpn_jax.train", "gpn_jax.evaluate", "gpn_jax.generate", "gpn_jax.analyze"} <= modules
    assert any(where.startswith("launch/") for where, *_ in COMMANDS)
    assert any("(--help)" in where for where, *_ in COMMANDS)


# readers of a run: their outputs must lie outside the run's workdir (`io.outputs`)
READERS = ("gpn_jax.analyze", "gpn_jax.evaluate", "gpn_jax.export")


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.normpath(path), os.path.normpath(folder)
    return path == folder or path.startswith(folder.rstrip("/") + "/")


@pytest.mark.parametrize("where,line,module,args", COMMANDS, ids=lambda v: str(v)[:60])
def test_a_reader_writes_outside_the_workdir(where, line, module, args):
    values = dict(a[2:].partition("=")[::2] for a in args if a.startswith("--"))
    if module in READERS and values.get("workdir") and values.get("out"):
        assert not _inside(values["out"], values["workdir"]), f"{where}: {line}"


@pytest.mark.slow  # one --helpfull subprocess per entry point
@pytest.mark.parametrize("where,line,module,args", COMMANDS, ids=lambda v: str(v)[:60])
def test_each_flag_path_and_config_field_exists(entry_flags, where, line, module, args):
    defined = entry_flags[module]
    config = None
    for arg in args:
        if not arg.startswith("--"):
            continue
        name, _, value = arg[2:].partition("=")
        if name.startswith("config."):
            assert config is not None, f"{where}: {line}: --{name} before --config"
            assert _has_field(config, name[len("config.") :]), (
                f"{where}: {line}: the config has no field {name[len('config.') :]!r}"
            )
            continue
        assert name in defined, f"{where}: {line}: {module} defines no flag --{name}"
        if name == "config" and "..." not in value:  # '...': a placeholder, not a file
            path, config_arg = _config_file(value)
            matches = _expand(path)
            assert matches, f"{where}: {line}: no config file {path}"
            if len(matches) == 1 and "$" not in path:
                config = _load_config(path, config_arg)
            else:  # a shell loop over several configs: check the fields on each
                config = _AllOf([_load_config(os.path.relpath(m, ROOT), None) for m in matches])


class _AllOf:
    """Several configs (a shell loop's): a field exists if every one has it."""

    def __init__(self, configs):
        self.configs = configs

    def __getitem__(self, key):
        return _AllOf([c[key] for c in self.configs])


def test_paths_into_the_repository_exist():
    missing = []
    for rel in PAGES:
        for line in _command_lines(_read(rel)):
            for path in _REPO_PATH.findall(line):
                if not _expand(path):
                    missing.append(f"{rel}: {path}")
    assert not missing, missing


def test_the_data_line_of_a_transcribed_result_says_so():
    transcribed = []
    for path in glob.glob(os.path.join(ROOT, "experiments", "results", "*.json")):
        with open(path, encoding="utf-8") as f:
            if json.load(f).get("provenance") == "transcribed":
                transcribed.append(os.path.basename(path))
    assert transcribed  # some are: the test would otherwise check nothing
    for rel in PAGES:
        for line in _read(rel).splitlines():
            if not line.startswith("<sub>Data:"):
                continue
            for name in transcribed:
                if f"/{name}]" in line:
                    assert "transcribed from the measurement log" in line, f"{rel}: {line}"


_TIMING = re.compile(
    r"\b(?:\d[\d.,]*|one|two|three|four|five|ten|a few)\s*(?:-\s*)?"
    r"(?:s|sec|secs|seconds?|min|minutes?|hours?)\b",
    re.IGNORECASE,
)


def test_the_readme_states_no_timings():
    prose = _BLOCK.sub("", _read("README.md"))
    prose = "\n".join(ln for ln in prose.splitlines() if not ln.startswith("|"))  # tables: data
    assert not _TIMING.findall(prose), _TIMING.findall(prose)


def _hub_commands() -> list[tuple[str, list[str]]]:
    """(page, words) of every `hf ...` command in the pages' code blocks."""
    found = []
    for rel in PAGES:
        for line in _command_lines(_read(rel)):
            if line.startswith("hf "):
                found.append((rel, shlex.split(line.split(" # ")[0])))
    return found


def test_the_hugging_face_commands_are_the_current_cli():
    """huggingface-hub 2.x has no `huggingface-cli`; its `hf` command takes the subcommands and
    flags the pages show (each one's --help, run with this interpreter)."""
    assert not [rel for rel in PAGES if "huggingface-cli" in _read(rel)]
    commands = _hub_commands()
    assert {words[1] for _, words in commands} >= {"download"}, commands
    pytest.importorskip("huggingface_hub.cli.hf")
    for rel, words in commands:
        code = "import sys; from huggingface_hub.cli.hf import main; sys.argv[0] = 'hf'; main()"
        help_text = subprocess.run(
            [sys.executable, "-c", code, words[1], "--help"],
            capture_output=True, text=True, timeout=60,
        ).stdout  # fmt: skip
        flags = {w.split("=", 1)[0] for w in words[2:] if w.startswith("--")}
        assert flags and all(f in help_text for f in flags), (rel, words, help_text[-1500:])
