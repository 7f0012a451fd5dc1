"""A `--config=FILE[:arg]` flag (ml_collections' `DEFINE_config_file`) and its overrides, checked
as one line each before or while absl parses them.

ml_collections loads the file while absl parses the flags: a missing file only fails when a
`--config.x=...` override touches the config (a traceback of ~60 lines), an exception in the
file escapes the parser, and an override without `--config` is an "unknown flag". `check(argv)`
reports what can be told from the command line and the file system; `load_error(argv, exc)`
names the file and line of an exception raised while running the config file. `resolve(argv)`
turns a named config (`--config=gpn_m_1l_130m`) into the package's file for it.
"""

import os
import re
import traceback

EXAMPLE = "experiments/configs/demo.py"
# The package's named configs (gpn_jax/configs/NAME.py with a get_config): found by path, not
# imported, so this foundation module imports nothing above it.
NAMED_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
_NAME = re.compile(r"[A-Za-z_]\w*")


def named_configs() -> list[str]:
    """The names `--config=NAME[:arg]` takes: gpn_jax/configs/*.py files with a get_config."""
    names = []
    for entry in sorted(os.listdir(NAMED_DIR)):
        path = os.path.join(NAMED_DIR, entry)
        if entry.endswith(".py") and not entry.startswith("_") and os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                if "\ndef get_config(" in f.read(1 << 20):
                    names.append(entry[:-3])
    return names


def resolve(argv: list[str], name: str = "config") -> list[str]:
    """`argv` with `--name=NAME[:arg]` (a named config, no such file here) replaced by the
    package's file for NAME: an installed gpn_jax needs no checkout to name its configs."""
    out = list(argv)
    for i, arg in enumerate(out):
        prefix = f"--{name}="
        if arg == "--":
            break
        if not arg.startswith(prefix):
            continue
        value = arg[len(prefix) :]
        path, colon, variant = value.partition(":")
        if _NAME.fullmatch(path) and not os.path.exists(path) and path in named_configs():
            out[i] = prefix + os.path.join(NAMED_DIR, path + ".py") + colon + variant
    return out


def config_flag_names(flag_values) -> list[str]:
    """The names of the `DEFINE_config_file` flags defined in `flag_values`."""
    from ml_collections.config_flags.config_flags import ConfigFileFlagParser

    return [n for n in flag_values if isinstance(flag_values[n].parser, ConfigFileFlagParser)]


def given(argv: list[str], name: str) -> str | None:
    """The value of `--name=V` or `--name V` in `argv` (the last one), or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        m = re.fullmatch(rf"--?{re.escape(name)}(?:=(.*))?", arg, re.S)
        if m:
            value = m[1] if m[1] is not None else (argv[i + 1] if i + 1 < len(argv) else "")
    return value


def overrides(argv: list[str], name: str) -> list[str]:
    """The `--name.field=...` arguments of `argv`."""
    return [a for a in argv if re.match(rf"--?(no)?{re.escape(name)}\.", a)]


def check(argv: list[str], name: str = "config") -> str | None:
    """One line for an override without `--name`, or a `--name` that names no readable file;
    None when the file is there (its loading may still fail: `load_error`)."""
    value = given(argv, name)
    if value is None:
        extra = overrides(argv, name)
        if not extra:
            return None  # absl says that a required --config is missing
        return f"{extra[0]} overrides a field of --{name}, which is not given; give --{name}=FILE"
    path = value.split(":", 1)[0]
    if not path:
        return f"--{name} is empty; give a config file, e.g. --{name}={EXAMPLE}"
    if os.path.isfile(path):
        return None
    what = "is a directory" if os.path.isdir(path) else "no such file"
    if what == "no such file" and _NAME.fullmatch(path):
        what = f"no such file or named config (named: {', '.join(named_configs())})"
    where = f"--{name}={value}" + (f": {path}" if path != value else "")
    return f"{where}: {what}; give a config file, e.g. --{name}={EXAMPLE}"


def load_error(argv: list[str], exc: BaseException, name: str = "config") -> str | None:
    """One line for `exc` if it was raised while loading or running the `--name` file: the
    file, the line of it that raised, and the error; None for any other exception."""
    value = given(argv, name)
    if not value:
        return None
    path = value.split(":", 1)[0]
    text = "".join(traceback.format_exception(exc))
    if isinstance(exc, SyntaxError) and _same(exc.filename, path):
        return f"--{name}={value}: line {exc.lineno}: {exc.msg} (SyntaxError)"
    lines = [int(n) for f, n in re.findall(r'File "([^"]+)", line (\d+)', text) if _same(f, path)]
    last = text.strip().splitlines()[-1].strip()  # the error the traceback ends with
    if lines:
        return f"--{name}={value}: line {lines[-1]}: {last}"
    if "Error whilst parsing config file" in text:  # get_config(arg) raised, in another module
        return f"--{name}={value}: {last}"
    if isinstance(exc, AttributeError) and "get_config" in str(exc):
        return f"--{name}={value}: the file defines no get_config(); is it a config file?"
    return None


def _same(a: str | None, b: str) -> bool:
    return bool(a) and os.path.realpath(a) == os.path.realpath(b)
