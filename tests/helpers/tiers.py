"""The suite's tiers: `slow` end-to-end tests are marked by hand; `process` is given at
collection to every test that starts a process (a CLI, a fresh interpreter, a launch script),
so the fast tier, `-m "not slow and not process"`, runs in the test workers alone.

A test starts processes when its source, or the source of a function it names (one of its
module's, or of a `tests.helpers` module it imports), calls `subprocess`, `sys.executable`,
`os.system`, `os.fork` or `multiprocessing`; or when it uses a fixture so defined. Processes the
library itself starts (the C++ kernels' compiler, `git` for window_ab) do not count: they are
what those tests check, and run in the fast tier too."""

import functools
import inspect
import re
import types

_SPAWNS = re.compile(
    r"\bsubprocess\b|\bPopen\b|sys\.executable|\bos\.system\b|\bos\.fork\b|\bmultiprocessing\b"
)


def _source(obj) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _spawns(fn) -> bool:
    return bool(_SPAWNS.search(_source(fn)))


@functools.cache
def spawning_names(module: types.ModuleType) -> frozenset:
    """Names in `module` of test-side functions that start processes: its own functions and
    fixtures, those it imports from tests/, and `helper.fn` for a tests.helpers module."""
    out = set()
    for name, obj in vars(module).items():
        target = getattr(obj, "__wrapped__", obj)  # a fixture's function
        if isinstance(target, types.FunctionType):
            if (target.__module__ or "").startswith("tests") and _spawns(target):
                out.add(name)
        elif isinstance(obj, types.ModuleType) and obj.__name__.startswith("tests.helpers"):
            for n, f in vars(obj).items():
                if isinstance(f, types.FunctionType) and f.__module__ == obj.__name__:
                    if _spawns(f):
                        out.add(f"{name}.{n}")
    return frozenset(out)


def starts_processes(fn, module: types.ModuleType, fixtures=()) -> bool:
    """Whether the test function `fn` of `module` (using `fixtures`) starts a process."""
    source = _source(fn)
    if _SPAWNS.search(source):
        return True
    names = spawning_names(module)
    if set(fixtures) & names:
        return True
    return any(re.search(rf"(?<![\w.]){re.escape(n)}\b", source) for n in names)
