"""Versions of the fused window compared in one process: their training steps taken in turn.

    python experiments/bench/window_ab.py --revs=HEAD~1,HEAD [--rounds=40] [--model=gpn_m]
    python experiments/bench/window_ab.py --revs=HEAD,HEAD --xla_options='[{}, {"xla_cpu_use_onednn": true}]'
    python experiments/bench/window_ab.py --revs=worktree,worktree \
        --model_overrides='[{"remat_segment": 32}, {"remat_segment": 32, "remat_parallel": true}]'

Each of `--revs` (git revisions; `worktree` for the checked-out files) gives its own fused
window: `gpn_jax/core/fused/window.py` with every part of `gpn_jax/core/fused/` (older
revisions: `core/fused_window.py` or `fast_window.py` and the `core/fused_*.py` parts), loaded as
a package of its own, and its own per-token
product kernel `gpn_jax/kernels/cpu/small_matmul.cc` where it has one and the kernel is used here
(`GPN_JAX_NATIVE`), built and registered under a name of its own (the memory kernels,
`gpn_jax.kernels.cpu.memory`, and every other module a window imports are the checked-out ones, so
a revision whose window imports a module the checkout no longer has cannot be loaded); the
`bench_small` training step of
`--model` (`gpn_jax/benchmarks/bench_config.py`) is compiled once with each, as the trainer runs it
(`gpn_jax.benchmarks.train.compiled_step`, steps inline). After two warm-up steps each, every
round takes one step of each version, the order rotated and reversed from round to round, so
that a shared machine's drift slows all of them alike (separate runs minutes apart can differ
by more than the change being measured). `--xla_options` pairs each revision with XLA
compile options of its own (a JSON list, one object per revision; the option names are XLA's
`DebugOptions` fields, e.g. `xla_cpu_experimental_ynn_fusion_type`), so one revision can be
compared against itself compiled differently, and `--model_overrides` pairs each with model
fields of its own (a JSON list, one object per revision, over `--model`'s block), so one revision
can be compared against itself with a switch flipped. Printed: each version's median and best step
time, then each version's median over rounds of its step time over the first version's, and in
how many rounds it was faster. Nothing is asserted.
"""

import importlib
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

_REVS = flags.DEFINE_list(
    "revs", ["HEAD~1", "HEAD"], "Git revisions; `worktree`: the files as they are."
)
_ROUNDS = flags.DEFINE_integer("rounds", 40, "Steps of each version, taken in turn.")
_MODEL = flags.DEFINE_string("model", "gpn_m", "A model of experiments/bench/bench_small.py.")
_XLA_OPTIONS = flags.DEFINE_string(
    "xla_options", "", "JSON list of XLA compile options, one object per revision; '': none."
)
_MODEL_OVERRIDES = flags.DEFINE_string(
    "model_overrides", "", "JSON list of model fields, one object per revision; '': none."
)

CORE = "gpn_jax/core"
PATH = f"{CORE}/fused/window.py"
# where each layout keeps the window: (folder, the window's module, its parts' file prefix)
LAYOUTS = (
    (f"{CORE}/fused", "window", ""),  # the fused package
    (CORE, "fused_window", "fused_"),  # before it: core/fused_*.py
    (CORE, "fast_window", "fused_"),  # before the window's rename
)
KERNEL = "gpn_jax/kernels/cpu/small_matmul.cc"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_KERNELS = itertools.count()  # kernels registered by this process


def revision_file(rev: str, path: str, tmp: str) -> str | None:
    """Where `rev`'s version of `path` is (copied into tmp from `git show`); None if it has none."""
    if rev == "worktree":
        source = os.path.join(ROOT, path)
        return source if os.path.exists(source) else None
    text = subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True
    )
    if text.returncode:
        return None
    stem, ext = os.path.splitext(os.path.basename(path))
    source = os.path.join(tmp, f"{stem}_{len(os.listdir(tmp))}{ext}")
    with open(source, "w") as f:
        f.write(text.stdout)
    return source


def folder_files(rev: str, folder: str) -> list[str]:
    """The file names in `rev`'s `folder` (none for a revision or folder that does not exist)."""
    if rev == "worktree":
        path = os.path.join(ROOT, folder)
        return sorted(os.listdir(path)) if os.path.isdir(path) else []
    out = subprocess.run(
        ["git", "ls-tree", "--name-only", f"{rev}:{folder}"], cwd=ROOT, capture_output=True,
        text=True,
    )  # fmt: skip
    return [] if out.returncode else out.stdout.split()


def load_window(rev: str, tmp: str):
    """The fused window of `rev` (its window module and every part of it: `core/fused/*.py`,
    or `core/fused_*.py` in older revisions), imported as a package of its own under `tmp`:
    the parts import each other there, not the checkout."""
    found = [(f, e, p) for f, e, p in LAYOUTS if f"{e}.py" in folder_files(rev, f)]
    if not found:
        raise SystemExit(f"window_ab: no {PATH} at revision {rev!r}")
    folder, entry, prefix = found[0]
    names = folder_files(rev, folder)
    package = f"window_ab_{len(os.listdir(tmp))}"
    os.makedirs(os.path.join(tmp, package))
    dotted = folder.replace("/", ".")
    own = re.compile(rf"\b{re.escape(dotted)}\.((?:{prefix}|fast_window)\w*)" if prefix
                     else rf"\b{re.escape(dotted)}\.(\w+)")  # fmt: skip
    parts = [n for n in names if n.endswith(".py") and n != "__init__.py"]
    for name in parts:
        if prefix and not (name.startswith(prefix) or name == f"{entry}.py"):
            continue
        with open(revision_file(rev, f"{folder}/{name}", tmp)) as f:
            text = own.sub(rf"{package}.\1", f.read())
        if not prefix:  # the package's own `from gpn_jax.core.fused import x`
            text = text.replace(f"from {dotted} import", f"from {package} import")
        with open(os.path.join(tmp, package, name), "w") as f:
            f.write(text)
    open(os.path.join(tmp, package, "__init__.py"), "w").close()
    if tmp not in sys.path:
        sys.path.insert(0, tmp)
    return importlib.import_module(f"{package}.{entry}")


def per_revision(flag: str, text: str, n: int) -> list[dict]:
    """A JSON-list flag (`--xla_options`, `--model_overrides`) as one dict per revision (all
    empty for ''), or a one-line exit."""
    if not text:
        return [{}] * n
    try:
        options = json.loads(text)
    except json.JSONDecodeError as e:
        raise SystemExit(f"window_ab: --{flag} is not JSON: {e}") from None
    if not isinstance(options, list) or not all(isinstance(o, dict) for o in options):
        raise SystemExit(f"window_ab: --{flag} must be a JSON list of objects")
    if len(options) != n:
        raise SystemExit(f"window_ab: --{flag} has {len(options)} objects for {n} revisions")
    return options


def load_kernel(rev: str, tmp: str) -> tuple[str, int] | None:
    """`rev`'s per-token product kernel, built and registered as an FFI target of its own:
    (target, tile width). None where `rev` has none or the kernel is not used here."""
    from pathlib import Path

    from gpn_jax.kernels.cpu import small_matmul

    source = revision_file(rev, KERNEL, tmp)
    if source is None or not small_matmul.available():
        return None
    out = Path(tmp) / f"kernel_{len(os.listdir(tmp))}.so"
    small_matmul.build(out, Path(source))
    target = f"{small_matmul.TARGET}_ab{next(_KERNELS)}"  # FFI targets live as long as JAX
    return target, small_matmul.register(out, target)


def compiled_steps(revs: list[str], model: str, options: list[dict], overrides: list[dict]) -> list:
    """One step function per revision, each compiled with that revision's window, its XLA
    options and its model fields (`per_revision`)."""
    import jax

    from gpn_jax.benchmarks import bench_config, train
    from gpn_jax.models import gpn as gpn_model

    t = bench_config.base_config("bench_small", "train").train
    cfg = bench_config.models()[model].to_dict()
    spec = dict(compute_dtype="auto", batch_size=t.batch_size, seq_len=t.seq_len)
    from gpn_jax.kernels.cpu import small_matmul

    steps, original = [], (gpn_model.fused_window, small_matmul.TARGET, small_matmul.load)
    with tempfile.TemporaryDirectory() as tmp:
        for rev, opts, fields in zip(revs, options, overrides, strict=True):
            gpn_model.fused_window = load_window(rev, tmp)  # read when the step is traced
            kernel = load_kernel(rev, tmp)
            if kernel is not None:  # read when the step is traced, as the window
                small_matmul.TARGET, tile = kernel
                small_matmul.load = lambda tile=tile: tile
            try:
                step = train.compiled_step(spec | dict(compiler_options=opts), cfg | fields)
                steps.append(step[0])
            except jax.errors.JaxRuntimeError as e:  # e.g. an option XLA does not know
                first = str(e).strip().splitlines()[0]
                raise SystemExit(f"window_ab: XLA refused {json.dumps(opts)}: {first}") from None
            finally:
                gpn_model.fused_window, small_matmul.TARGET, small_matmul.load = original
    return steps


def main(argv):
    del argv
    from gpn_jax.training import host_memory

    host_memory.inline_cpu_steps()  # before JAX starts, as the trainer's launcher
    import jax

    revs = _REVS.value
    if len(revs) < 2:
        raise SystemExit("window_ab: --revs needs two revisions or more")
    options = per_revision("xla_options", _XLA_OPTIONS.value, len(revs))
    overrides = per_revision("model_overrides", _MODEL_OVERRIDES.value, len(revs))
    steps = compiled_steps(revs, _MODEL.value, options, overrides)
    revs = [
        r + "".join(f" {json.dumps(o)}" for o in (opts, fields) if o)
        for r, opts, fields in zip(revs, options, overrides, strict=True)
    ]
    for one in steps:
        for _ in range(2):
            jax.block_until_ready(one())
    times = [[] for _ in steps]
    n = len(steps)
    for r in range(_ROUNDS.value):
        order = [(r + j) % n for j in range(n)]
        for k in order[::-1] if r % 2 else order:
            t0 = time.perf_counter()
            jax.block_until_ready(steps[k]())
            times[k].append(time.perf_counter() - t0)
    print(f"{_MODEL.value}, bench_small training step, {_ROUNDS.value} rounds")
    for rev, ts in zip(revs, times, strict=True):
        print(f"  {rev:12s} step median {statistics.median(ts):.3f} s (best {min(ts):.3f})")
    for rev, ts in zip(revs[1:], times[1:], strict=True):
        ratios = [a / b for a, b in zip(ts, times[0], strict=True)]
        faster = sum(x < 1 for x in ratios)
        print(
            f"  {rev} / {revs[0]}: median {statistics.median(ratios):.3f} "
            f"({faster} of {len(ratios)} rounds faster)"
        )


if __name__ == "__main__":
    sys.exit(app.run(main))
