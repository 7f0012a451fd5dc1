"""The prepared accelerator run (`experiments/bench/accel_bench.py`): versions, a smoke test of
every part, then the parts in order of value, each in its own process under its own time
budget, each writing its own result file as it goes.

This process never starts a JAX client (the parts do, one at a time), and it sets
`XLA_PYTHON_CLIENT_PREALLOCATE=false` for all of them before any starts: no process reserves
most of the device's memory up front. A part's budget is its share (`settings["budgets"]`)
plus what the parts before it left unused, never past the run's deadline; a part cut off by
its timeout keeps the rows it saved (`accel_parts.Out`). Outputs, in `out` (at most 8 files,
each under 16 MiB, as a lent machine returns):

  versions.json    versions, device, and the smoke test's outcome per part (--device)
  check.json       (a) Pallas against the XLA formulas; 5 training steps pallas against xla
  passes.json      (b) µs per token and GB/s of the memory's passes against a copy bandwidth
  step.json        (c) the GPN+M step per kernels x memory dtype x batch
  baselines.json   (d) Transformer++ and Gated DeltaNet at the same tokens per step
  hlo.json         (e) the per-token loops' operations and a one-step profile table
  train_step.hlo.txt  (e) the optimised HLO of the Pallas step
(the eighth, `log.txt`, is the caller's copy of the output: `experiments/bench/h200_run.sh`).
Everything else (workers' HLO, traces) goes to a scratch folder outside `out`, removed at the end.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from gpn_jax.io import files, untrusted
from gpn_jax.io.paths import is_temporary

os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # inherited by every part

PARTS = ("check", "passes", "step", "baselines", "hlo")
FILES = {p: f"{p}.json" for p in PARTS} | {"versions": "versions.json"}
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pass_row(dtype: str, name: str, backend: str, timed: dict, copy_bw: float) -> dict:
    """One pass's timing as µs per token and GB/s of its minimum bytes against `copy_bw`."""
    us = timed[f"{backend}_us_per_token"]
    bytes_per_s = timed["min_bytes_per_token"] / (us * 1e-6)
    return {
        "memory_dtype": dtype,
        "pass": name,
        "backend": backend,
        "us_per_token": us,
        "gb_per_s": bytes_per_s / 1e9,
        "fraction_of_copy_bandwidth": bytes_per_s / copy_bw,
    }


def run_part(
    part: str, settings_path: str, out_path: str, scratch: str, timeout: float, extra_env=None
) -> dict:
    """Runs `part` in its own process within `timeout` seconds: {"part", "status" (ok,
    failed, timeout), "seconds", "tail"}; its output is printed as it comes."""
    env = dict(os.environ) | dict(extra_env or {})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH", "")) if p)
    env["GPN_JAX_ACCEL_DEADLINE"] = str(time.time() + timeout)
    env.setdefault("PYTHONUNBUFFERED", "1")
    cmd = [sys.executable, "-m", "experiments.bench.accel_parts", part, settings_path]
    t0 = time.monotonic()
    print(f"== {part} (budget {timeout:.0f} s)", flush=True)
    with subprocess.Popen(
        cmd + [out_path, scratch], env=env, cwd=_ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
    ) as proc:  # fmt: skip
        try:
            tail, killed = _follow(proc, t0 + timeout)
        finally:  # this process stopped (a signal, an error): the part and its workers too
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    # (Popen's exit waits again, and reads a killed child it already reaped as code 0)
    status = "timeout" if killed else "ok" if proc.returncode == 0 else "failed"
    rec = {"part": part, "status": status, "seconds": round(time.monotonic() - t0, 1)}
    if status != "ok":
        rec["tail"] = tail[-5:]
    print(f"== {part}: {status} in {rec['seconds']} s", flush=True)
    return rec


def _follow(proc, deadline: float) -> tuple[list[str], bool]:
    """Prints the part's output as it comes (read in chunks: a line the part has not ended
    cannot hold this loop past `deadline`); kills its process group at `deadline`. The last
    lines, for the run's record, and whether it was killed."""
    import selectors

    fd, buf, tail = proc.stdout.fileno(), b"", []
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.killpg(proc.pid, 9)
            proc.wait()
            return tail, True
        if not sel.select(timeout=min(left, 1.0)):
            continue
        chunk = os.read(fd, 1 << 16)
        *lines, buf = (buf + chunk).split(b"\n")
        for line in lines + ([buf] if not chunk and buf else []):
            text = line.decode(errors="replace").rstrip()
            print("   " + text, flush=True)
            tail = (tail + [text[-300:]])[-20:]
        if not chunk:
            proc.wait()
            return tail, False


def smoke(settings_path: str, scratch: str, budget: float, env=None) -> dict:
    """Every part at the rehearsal's toy shapes on this device, in `budget` seconds all
    together: {part: "ok" | what failed}."""
    folder = os.path.join(scratch, "smoke")
    os.makedirs(folder, exist_ok=True)
    deadline, outcome = time.monotonic() + budget, {}
    for part in PARTS:
        left = deadline - time.monotonic()
        if left < 5:
            outcome[part] = "not run: out of time"
            continue
        r = run_part(part, settings_path, os.path.join(folder, FILES[part]), folder, left, env)
        outcome[part] = "ok" if r["status"] == "ok" else f"{r['status']}: {r.get('tail', [])}"
    return outcome


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP (an outer `timeout`, a closed session) end this process through
    Python's exit, so the part running then is killed with its process group (`run_part`),
    not left holding the device in a session of its own."""

    def _exit(signum, frame):
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit)


def run(settings: dict, out: str, budget_s: float, parts=PARTS, smoke_settings=None) -> dict:
    """The run into folder `out` within `budget_s` seconds; {part: its run record}."""
    stop_on_signals()
    deadline = time.monotonic() + budget_s
    os.makedirs(out, exist_ok=True)
    # a scratch file that cannot be removed must not turn the finished run into an error
    with tempfile.TemporaryDirectory(
        prefix="accel-scratch-", ignore_cleanup_errors=True
    ) as scratch:
        return _run_in(settings, out, deadline, parts, smoke_settings, scratch)


def _run_in(settings, out, deadline, parts, smoke_settings, scratch: str) -> dict:
    """`run` with its scratch folder (workers' HLO and traces; removed afterwards)."""
    paths = {}
    for name, s in (("settings", settings), ("smoke_settings", smoke_settings)):
        if s is not None:
            paths[name] = os.path.join(scratch, f"{name}.json")
            files.atomic_write(paths[name], json.dumps(s).encode())
    vpath = os.path.join(out, FILES["versions"])
    env = settings.get("env")
    runs = {"versions": run_part("versions", paths["settings"], vpath, scratch, 120, env)}
    if smoke_settings is not None:
        budget = min(settings["budgets"]["smoke"], deadline - time.monotonic())
        _amend(vpath, smoke=smoke(paths["smoke_settings"], scratch, budget, env))
    carry = 0.0
    for part in dict.fromkeys(parts):  # in the caller's order
        start = time.monotonic()
        timeout = min(settings["budgets"][part] + carry, deadline - start)
        if timeout < 5:
            runs[part] = {"part": part, "status": "skipped: out of time"}
            continue
        path = os.path.join(out, FILES[part])
        runs[part] = run_part(part, paths["settings"], path, scratch, timeout, env)
        carry = max(0.0, timeout - (time.monotonic() - start))
    _amend(vpath, parts=runs)
    for name in os.listdir(out):  # a part killed while saving leaves its temporary file
        if is_temporary(name):
            os.unlink(os.path.join(out, name))
    return runs


def _amend(path: str, **fields) -> None:
    """Adds `fields` to the JSON object at `path` (our own versions file; atomically)."""
    data = {}
    if os.path.exists(path):
        data = untrusted.read_json(path, fix="delete it and run again")
    data.update(fields)
    files.atomic_write(path, json.dumps(data, indent=1, default=str).encode())
