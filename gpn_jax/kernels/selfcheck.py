"""First-use self-check of the Pallas kernels on the device they are about to run on.

Before `model.kernels` resolves to the Pallas kernels on a GPU or TPU (`gpn_jax.kernels.resolve`),
`ensure` runs each of the memory's passes (step, stack, grad) once at small shapes on that device and
compares it with the reference backend (`gpn_jax.kernels.xla`) computed on the same device from the same inputs
(`compare_passes`). A pass that fails to lower, compile or run, or whose result is off by more
than the bound below, fails the check: `auto` then keeps XLA's formulas (one warning naming the
pass), an explicit `pallas` is a one-line error. It takes a few seconds (three small compiles);
the outcome is cached per device kind, storage dtype and library versions (`cache_key`), and
every check this process made or read is kept for `run_info` (`recorded`).

The cache is one small JSON file in the user's cache directory (`$GPN_JAX_SELFCHECK_CACHE`,
else `$XDG_CACHE_HOME/gpn_jax`, else `~/.cache/gpn_jax`), written atomically (a temporary file
renamed over it). It is read as untrusted: a file over `MAX_CACHE_BYTES`, not JSON, or an
entry that does not have the schema is ignored (the check runs again and rewrites it).

Bounds (norm-relative, per output; derived, not measured): the kernels and the formulas do
the same float32 arithmetic in different orders, so each output differs by at most about
n x eps32 with n the longest chain of dependent roundings (K + U for a write and its read,
S (K + U) through the recomputation's S writes, K U for <dM, Mi>), times MARGIN for the chains
the count leaves out. With bfloat16 storage both round the same float32 values to bfloat16,
which may land one bfloat16 step (2^-7 relative) apart, once per stored memory (S times
through the recomputation). The reference runs at `highest` matmul precision, so a GPU's
TF32 products do not enter it.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import os
import time
from pathlib import Path

from gpn_jax.io import files, provenance
from gpn_jax.io.regular import read_regular_file

PASSES = ("step", "stack", "grad")
STORAGE = ("float32", "bfloat16")  # the kernels' storage dtypes (`pallas.MEMORY_DTYPES`)
DIMS = (2, 2, 32, 64, 4)  # B, H, K, U, S: K and U's 64-column tile powers of two (Triton)
EPS32 = 2.0**-23
EPS_BF16 = 2.0**-7
MARGIN = 16
MAX_CACHE_BYTES = 64 * 1024
CACHE_FILE = "kernel_selfcheck.json"
_ENTRY_KEYS = {"status", "failed_pass", "stage", "reason"}
_STATUSES = ("passed", "failed")
_RECORDS: list[dict] = []


# ----------------------------------------------------------------------------- references
def references() -> dict:
    """The reference backend's passes (`gpn_jax.kernels.xla`), which the kernels must match."""
    from gpn_jax.kernels import xla

    return {name: getattr(xla, name) for name in PASSES}


def inputs(dims, memory_dtype: str, seed: int = 0) -> dict:
    """Each pass's arguments at `dims` (B, H, K, U, S), in their real ranges (unit keys and
    queries, beta in (0.1, 0.9), eg in (0.5, 1)), row 1 reset at the grads' step t = 1; numpy
    arrays, so that building them stages nothing into a trace in progress."""
    import jax.numpy as jnp
    import numpy as np

    B, H, K, U, S = dims
    rng = np.random.default_rng(seed)
    f32 = np.float32
    dtype = jnp.dtype(memory_dtype)  # numpy's bfloat16 is ml_dtypes', as jnp names it
    unit = lambda x: (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(f32)  # noqa: E731
    k, q = unit(rng.normal(size=(S, B, H, K))), unit(rng.normal(size=(S, B, H, K)))
    v = rng.normal(size=(S, B, H, U)).astype(f32)
    beta = rng.uniform(0.1, 0.9, size=(S, B, H)).astype(f32)
    eg = rng.uniform(0.5, 1.0, size=(S, B, H)).astype(f32)
    M = rng.normal(size=(B, H, K, U)).astype(dtype)
    Ms = rng.normal(size=(S, B, H, K, U)).astype(dtype)
    dM = rng.normal(size=(B, H, K, U)).astype(f32)
    keep = np.ones((S, B), f32)
    keep[1, 1] = 0.0
    w, dkM_read, dqM = rng.normal(size=(3, B, H, U)).astype(f32)
    t = np.int32(1)
    return {
        "step": (M, k[0], q[0], v[0], beta[0], eg[0]),
        "stack": (M, k, q, v, beta, eg, keep),
        "grad": (Ms, t, keep[1], dM, k[1], q[1], w, beta[1], eg[1], dkM_read, dqM),
    }


def bound(name: str, dims, memory_dtype: str) -> float:
    """The norm-relative bound of pass `name`'s outputs (module docstring)."""
    B, H, K, U, S = dims
    chain = {"step": K + U, "stack": S * (K + U), "grad": K * U}  # grad: <dM, Mi>'s K U
    store = 0.0
    if memory_dtype == "bfloat16":
        store = EPS_BF16 * (S if name == "stack" else 1)
    return EPS32 * chain[name] * MARGIN + store


def _rel_errors(got, want) -> list[float]:
    import numpy as np

    errs = []
    for a, b in zip(got, want, strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape:
            return [float("inf")]
        norm = np.linalg.norm(b.ravel())
        errs.append(float(np.linalg.norm((a - b).ravel()) / (norm if norm > 0 else 1.0)))
    return errs


def _one_line(e: BaseException) -> str:
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text if len(text) <= 240 else text[:120] + " ... " + text[-110:]


def check_pass(name: str, kernel, reference, args, device, limit: float) -> dict:
    """One pass on `device`: {"ok", "stage" (lower, compile, run, match), "rel_err", "bound",
    "error"}. The reference runs at `highest` matmul precision on the same device."""
    import jax

    out = {"ok": False, "stage": "lower", "rel_err": None, "bound": limit, "error": None}
    try:
        with jax.default_device(device):
            args = jax.device_put(args, device)
            lowered = jax.jit(kernel).lower(*args)
            out["stage"] = "compile"
            compiled = lowered.compile()
            out["stage"] = "run"
            got = jax.block_until_ready(compiled(*args))
            with jax.default_matmul_precision("highest"):
                want = jax.block_until_ready(jax.jit(reference)(*args))
    except Exception as e:  # noqa: BLE001 - any failure of the kernel is the check's result
        out["error"] = _one_line(e)
        return out
    errs = _rel_errors(got, want)
    out.update(stage="match", rel_err=max(errs))
    out["ok"] = all(e <= limit for e in errs)  # NaN fails
    return out


def compare_passes(passes, device, memory_dtype: str, dims=DIMS, names=PASSES) -> dict:
    """{pass: `check_pass` result} of `passes` (an object with the passes as attributes,
    e.g. `gpn_jax.kernels.pallas.memory_kernels(...)`) against the XLA formulas on `device`."""
    refs, args = references(), inputs(dims, memory_dtype)

    def run():
        return {
            n: check_pass(
                n, getattr(passes, n), refs[n], args[n], device, bound(n, dims, memory_dtype)
            )
            for n in names
        }

    # on a thread of its own: JAX's trace state is per thread, so a check that starts while a
    # step is being traced (a model resolving its kernels then) runs eagerly, not into it
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def first_failure(results: dict) -> tuple[str, dict] | None:
    """(pass, its result) of the first pass that failed, in `PASSES` order; None if all passed."""
    return next(((n, r) for n, r in results.items() if not r["ok"]), None)


# ----------------------------------------------------------------------------- the cache
def cache_path() -> Path:
    """The cache file (module docstring); its directory is created 0700 if missing."""
    root = os.environ.get("GPN_JAX_SELFCHECK_CACHE")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "gpn_jax")
    path = Path(root)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path / CACHE_FILE


def _kernel_sources_digest() -> str:
    """sha256 of the Pallas kernels' sources: a change to a kernel checks it again."""
    h = hashlib.sha256()
    folder = Path(__file__).parent / "pallas"
    for p in sorted(folder.glob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def cache_key(device, memory_dtype: str) -> str:
    """What a cached outcome holds for: device kind, storage dtype, jax / jaxlib versions and
    the kernels' sources."""
    import jax

    jaxlib = provenance.installed_version("jaxlib", "?")
    kind = getattr(device, "device_kind", device.platform)
    return (
        f"{device.platform}|{kind}|{memory_dtype}|jax {jax.__version__}|jaxlib {jaxlib}|"
        f"src {_kernel_sources_digest()}"
    )


def _valid_entry(entry) -> bool:
    return (
        isinstance(entry, dict)
        and set(entry) == _ENTRY_KEYS
        and entry["status"] in _STATUSES
        and all(entry[k] is None or isinstance(entry[k], str) for k in _ENTRY_KEYS - {"status"})
    )


def load_cache(path: Path) -> dict:
    """The cache's valid entries ({key: entry}); {} for a missing, oversized, unreadable or
    malformed file (never an error: the check simply runs again)."""
    try:
        if path.is_symlink():
            return {}
        data = json.loads(read_regular_file(path, MAX_CACHE_BYTES))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and _valid_entry(v)}


def store(path: Path, key: str, entry: dict) -> None:
    """Adds `entry` under `key` (atomically: `io.files.atomic_write`)."""
    data = load_cache(path)
    data[key] = {k: entry.get(k) for k in _ENTRY_KEYS}
    text = json.dumps(data, indent=1, sort_keys=True)
    if len(text) > MAX_CACHE_BYTES:  # a cache that grew over its limit starts afresh
        text = json.dumps({key: data[key]}, indent=1)
    files.atomic_write(str(path), (text + "\n").encode(), private=True)


# ----------------------------------------------------------------------------- the check
def device_for(platform: str):
    """The first device of `platform` in this process, or None (e.g. compiling for a TPU
    from a CPU host: nothing to run the check on)."""
    import jax

    try:
        devices = jax.devices(platform)
    except RuntimeError:
        return None
    return devices[0] if devices else None


def _run(passes, device, memory_dtype: str) -> dict:
    t0 = time.perf_counter()
    results = compare_passes(passes, device, memory_dtype)
    bad = first_failure(results)
    entry = {"status": "passed", "failed_pass": None, "stage": None, "reason": None}
    if bad:
        name, r = bad
        why = r["error"] or f"relative error {r['rel_err']:.2e} over the bound {r['bound']:.1e}"
        entry = {"status": "failed", "failed_pass": name, "stage": r["stage"], "reason": why}
    return entry | {"seconds": round(time.perf_counter() - t0, 2), "passes": results}


def ensure(platform: str, passes, memory_dtype: str = "float32") -> dict:
    """The self-check of `passes` on `platform`'s device (from the cache, or run and cached):
    a record with status 'passed', 'failed' (failed_pass, stage, reason) or 'skipped' (no
    such device in this process), kept for `recorded`."""
    if memory_dtype not in STORAGE:  # the window keeps its XLA formulas for such a memory
        memory_dtype = "float32"
    device = device_for(platform)
    record = {"platform": platform, "memory_dtype": memory_dtype}
    if device is None:
        record |= {"status": "skipped", "reason": f"no {platform} device in this process"}
        _RECORDS.append(record)
        return record
    key = cache_key(device, memory_dtype)
    record |= {"device_kind": getattr(device, "device_kind", platform), "key": key}
    try:
        path = cache_path()
    except OSError as e:
        logging.warning("gpn_jax: kernel self-check cache unavailable (%s)", _one_line(e))
        path = None
    cached = load_cache(path).get(key) if path else None
    if cached:
        record |= cached | {"cached": True}
    else:
        record |= _run(passes, device, memory_dtype) | {"cached": False}
        if path:
            try:
                store(path, key, record)
            except OSError as e:
                logging.warning("gpn_jax: kernel self-check not cached (%s)", _one_line(e))
    _RECORDS.append(record)
    return record


def reason(record: dict) -> str:
    """One line: why a failed check keeps the kernels off this device."""
    text = (
        f"the self-check of pass {record['failed_pass']} failed at {record['stage']} on "
        f"{record.get('device_kind', record['platform'])} ({record['reason']})"
    )
    return " ".join(text.split())[:600]  # a cached reason is untrusted text: one line


def recorded(platform: str | None = None) -> list[dict]:
    """Every check this process ran or read from the cache (without per-pass details), or
    those for `platform` only: a run records its own devices' (a compile for another platform
    in the same process, `gpn_jax.aot --topology=h100`, checks nothing of the run's)."""
    return [
        {k: v for k, v in r.items() if k != "passes"}
        for r in _RECORDS
        if platform is None or r["platform"] == platform
    ]
