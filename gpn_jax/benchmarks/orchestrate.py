"""The benchmark suites' orchestration: specs from a bench config, one worker process per
record, the measured peaks, the report and the JSON (what `python -m gpn_jax.bench` runs;
the suites and outputs are described in `gpn_jax/bench.py`)."""

import json
import math
import os

# On GPU the parent (peak matmul) and each record's worker process share the device: no
# process may grab most of its memory up front. Set before JAX is imported.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import platform as pyplatform
import subprocess
import sys
import tempfile
import time

from gpn_jax.io import files, untrusted

PROG = "gpn-bench"
SUITES = ("train", "scaling", "generate", "alternate")


def sqrt_segment(T: int) -> int:
    """The largest divisor of T not above sqrt(T): the remat segment of the scaling sweep."""
    r = math.isqrt(T)
    return max(c for c in range(1, r + 1) if T % c == 0)


def build_specs(config, suites, workdir: str, profile: bool) -> list[dict]:
    """One spec per worker run (a training record, or a model x batch of generation records)."""
    models = config.models.to_dict()
    shared = dict(
        config=config.name,
        compute_dtype=config.compute_dtype,
        peak_size=config.peak.size,
        peak_reps=max(1, config.peak.reps // 2),
    )

    def model(name):
        if name not in models:
            raise ValueError(f"unknown model {name!r}; the config has {sorted(models)}")
        return models[name]

    specs = []
    if "train" in suites:
        specs += _train_specs(config.train, shared, model, workdir, profile)
    if "scaling" in suites:
        specs += _scaling_specs(config.scaling, shared, model, config.name)
    if "generate" in suites:
        specs += _generate_specs(config.generate, shared, model)
    if "alternate" in suites:
        specs.append(_alternate_spec(config.alternate, config.train, shared, model))
    return specs


def _alternate_spec(a, t, shared: dict, model) -> dict:
    chosen = names(a.models)
    if a.reference not in chosen:
        raise ValueError(
            f"alternate.reference {a.reference!r} is not among alternate.models {chosen}"
        )
    if a.rounds < 1:
        raise ValueError(f"alternate.rounds must be at least 1, got {a.rounds}")
    return shared | dict(
        suite="alternate",
        name=",".join(chosen),
        models={name: model(name) for name in chosen},
        reference=a.reference,
        batch_size=t.batch_size,
        seq_len=t.seq_len,
        warmup=a.warmup,
        rounds=a.rounds,
    )


def _train_specs(t, shared: dict, model, workdir: str, profile: bool) -> list[dict]:
    return [
        shared
        | dict(
            suite="train",
            name=name,
            model=model(name),
            batch_size=t.batch_size,
            seq_len=t.seq_len,
            warmup=t.warmup,
            steps=t.steps,
            profile_dir=os.path.join(workdir, "profile", name) if profile else "",
            timeout_s=t.get("timeout_s"),
        )
        for name in names(t.models)
    ]


def _scaling_specs(s, shared: dict, model, config_name: str) -> list[dict]:
    points = [(s.batch_size, T) for T in s.seq_lens]
    points += [(B, s.seq_len) for B in s.batch_sizes if (B, s.seq_len) not in points]
    return [
        shared
        | dict(
            suite="scaling",
            name=s.model,
            model=model(s.model),
            batch_size=B,
            seq_len=T,
            warmup=s.warmup,
            steps=s.steps,
            overrides=dict(remat_segment=remat),
            config=f"{config_name}:B{B}xT{T}:remat{remat}",
        )
        for B, T in points
        for remat in (0, sqrt_segment(T))
    ]


def _generate_specs(g, shared: dict, model) -> list[dict]:
    return [
        shared
        | dict(
            suite="generate",
            name=name,
            model=model(name),
            batch_size=B,
            contexts=list(g.contexts),
            steps=g.steps,
            rounds=g.rounds,
            warmup=g.warmup,
            feed_window=g.feed_window,
            kv_cache_limit_bytes=int(g.kv_cache_limit_gb * 2**30),
        )
        for name in names(g.models)
        for B in g.batch_sizes
    ]


def names(csv: str) -> list[str]:
    return [n.strip() for n in csv.split(",") if n.strip()]


def run_spec(spec: dict, isolate: bool) -> dict:
    """{'records': [...], 'peak_flops': [...]} of one spec, in a fresh process when `isolate`
    (with the spec's `xla_flags`, if any, added to the process's XLA_FLAGS: XLA reads them
    once, when a process starts its backend, so a spec with flags needs its own process)."""
    flags = spec.get("xla_flags")
    if not isolate:
        if flags:
            raise ValueError(f"spec {spec.get('name')!r} sets xla_flags: run it in its own process")
        from gpn_jax.benchmarks import worker

        return worker.run_spec(spec)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    if flags:
        env["XLA_FLAGS"] = " ".join(f for f in (env.get("XLA_FLAGS", ""), flags) if f)
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
        files.atomic_write(spec_path, json.dumps(spec).encode())
        proc = subprocess.run(
            [sys.executable, "-m", "gpn_jax.benchmarks.worker", spec_path, out_path],
            env=env,
            cwd=root,
            capture_output=True,
            text=True,
            timeout=spec.get("timeout_s"),  # None: no limit; a timeout fails this record
        )
        if proc.returncode or not os.path.exists(out_path):
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"worker exited with status {proc.returncode}: {' | '.join(tail)}")
        return untrusted.read_json(out_path, fix="a bug in the benchmark worker: report it")


def _describe(spec: dict) -> str:
    if spec["suite"] == "generate":
        return f"generate {spec['name']} B={spec['batch_size']} contexts={spec['contexts']}"
    if spec["suite"] == "alternate":
        return (
            f"alternate {spec['name']} B={spec['batch_size']} T={spec['seq_len']}, "
            f"{spec['rounds']} rounds"
        )
    extra = spec.get("overrides", {}).get("remat_segment")
    remat = f" remat={extra or 'off'}" if extra is not None else ""
    return f"{spec['suite']} {spec['name']} B={spec['batch_size']} T={spec['seq_len']}{remat}"


def _line(r: dict) -> str:
    if r.get("skipped"):
        return f"skipped ({r['skipped']})"
    if r["suite"] == "generate":
        return (
            f"ctx {r['context']:,}: {1e3 * r['latency_s']:.2f} ms/token, "
            f"{r['tokens_per_s']:,.1f} tokens/s"
        )
    if r["suite"] == "alternate":
        return (
            f"{r['model']}: {r['step_time_s']:.3f} s/step, {r['vs_reference']:.2f}x "
            f"{r['reference']} (median of per-round ratios)"
        )
    return (
        f"{r['step_time_s']:.3f} s/step, {r['tokens_per_s']:,.0f} tokens/s, "
        f"{r['achieved_flops'] / 1e9:.1f} GFLOP/s, peak mem {r['peak_mem_bytes'] / 2**30:.2f} GiB"
    )


def _run_all(specs: list[dict], isolate: bool, peaks: list) -> list[dict]:
    """Every spec's records (an error record for a failed spec); appends measured peaks."""
    records = []
    for i, spec in enumerate(specs):
        t0 = time.perf_counter()
        print(f"[{i + 1}/{len(specs)}] {_describe(spec)} ...", flush=True)
        try:
            result = run_spec(spec, isolate)
        except Exception as e:  # noqa: BLE001 - one failed record must not lose the others
            print(f"    failed: {e}", flush=True)
            records.append(
                {
                    "model": spec["name"],
                    "config": spec["config"],
                    "suite": spec["suite"],
                    "error": str(e),
                    "tokens_per_s": None,
                    "mfu": None,
                    "peak_mem_bytes": None,
                }
            )
            continue
        peaks += result["peak_flops"]
        for r in result["records"]:
            print(f"    {_line(r)}  ({time.perf_counter() - t0:.0f} s)", flush=True)
        records += result["records"]
    return records


def _complete(records: list[dict], peak: float, machine: str, platform: str) -> None:
    """MFU against the run's peak, and the machine, on every record."""
    import jax

    for r in records:
        if r.get("achieved_flops") is not None:
            r["mfu"] = r["achieved_flops"] / peak
        else:
            r.setdefault("mfu", None)
            r.setdefault("tokens_per_s", None)
            r.setdefault("peak_mem_bytes", None)
        r.update(peak_flops=peak, machine=machine, platform=platform, jax_version=jax.__version__)


def _scaling_lines(ok: list[dict], workdir: str, name: str) -> list[str]:
    from gpn_jax.benchmarks import report

    lines = []
    for remat in (False, True):
        for B in {r["batch_size"] for r in ok if r.get("suite") == "scaling"}:
            slopes = report.memory_slopes(ok, remat, B)
            if len(slopes) > 1:
                desc = ", ".join(f"{a}->{b}: {s:.2f}" for a, b, s in slopes)
                lines.append(
                    f"\nmemory log-log slope vs T (B={B}, remat {'on' if remat else 'off'}): {desc}"
                )
    png = os.path.join(workdir, f"{name}_scaling.png")
    if report.plot_scaling(ok, png):
        lines.append(f"\nplot: {png}")
    return lines


def _cpu_line() -> str:
    """The header's CPU line: its vector extensions and what the window's products run on."""
    from gpn_jax.benchmarks import measure
    from gpn_jax.kernels.cpu import small_matmul

    return (
        f"CPU vector extensions: {measure.cpu_vector_extensions()}; the fused window's per-token "
        f"products: {small_matmul.status()}"
    )


def _summary(config, records, suites, workdir, machine, dtype, peaks, bws, specs=()) -> str:
    """The printed / saved report: header, one table per suite, roofline, scaling slopes, checks."""
    import jax

    from gpn_jax.benchmarks import report, roofline

    peak = max(peaks)
    sections = [
        f"{config.name}: {machine}, {dtype}, jax {jax.__version__}, python {pyplatform.python_version()}",
        _cpu_line(),
        f"matmul peak measured in this run: {peak / 1e9:.1f} GFLOP/s "
        f"(samples {', '.join(f'{p / 1e9:.0f}' for p in peaks)}); load average at end {_load()}",
        f"memory bandwidth measured in this run (`measure.memory_bandwidth`: jitted JAX x <- -x "
        f"over a large float32 array, read + write): {max(bws) / 1e9:.1f} GB/s (samples {', '.join(f'{b / 1e9:.1f}' for b in bws)})",
    ]
    ok = [r for r in records if not r.get("error")]
    for title, table in (
        ("Training step", report.train_table(ok)),
        ("Scaling", report.scaling_table(ok)),
        ("Generation", report.generate_table(ok)),
        ("Training step, alternated in one process", report.alternate_table(ok)),
        ("Roofline (per token)", roofline.table(ok, peak, max(bws), specs)),
    ):
        if table:
            sections += ["", f"## {title}", "", table]
    byte_lines = roofline.byte_lines(ok)
    if byte_lines:
        sections += [""] + byte_lines
    if "scaling" in suites and ok:
        sections += _scaling_lines(ok, workdir, config.name)
    checks = report.generate_checks(ok)
    if checks:
        sections += [""] + checks
    return "\n".join(sections)


def run(
    config,
    workdir: str,
    out: str,
    suites: list[str],
    profile: bool,
    isolate: bool,
    device_spec: str = "",
) -> list[dict]:
    from gpn_jax.benchmarks import measure, roofline, workdirs

    specs_hw = roofline.parse_device_specs(device_spec)
    unknown = sorted(set(suites) - set(SUITES))
    if unknown:
        raise ValueError(f"unknown suite(s) {unknown}; choose from {list(SUITES)}")
    workdir = workdirs.prepare(workdir, PROG)
    specs = build_specs(config, suites, workdir, profile)
    dtype = measure.resolve_dtype(config.compute_dtype)
    machine = measure.device_kind()
    print(
        f"{PROG}: {config.name} on {machine} ({measure.platform()}, {dtype}), "
        f"load average {_load()}",
        flush=True,
    )
    print(_cpu_line(), flush=True)
    peaks = [measure.peak_matmul_flops(dtype, config.peak.size, config.peak.reps)]
    bw_mib = config.peak.get("bandwidth_mib", 0)  # absent in configs written before it
    bws = [measure.memory_bandwidth(bw_mib)]
    print(
        f"matmul peak ({dtype}): {peaks[0] / 1e9:.1f} GFLOP/s; "
        f"memory bandwidth: {bws[0] / 1e9:.1f} GB/s",
        flush=True,
    )
    records = _run_all(specs, isolate, peaks)
    peaks.append(measure.peak_matmul_flops(dtype, config.peak.size, config.peak.reps))
    bws.append(measure.memory_bandwidth(bw_mib))
    _complete(records, max(peaks), machine, measure.platform())
    for r in records:
        r["memory_bandwidth"] = max(bws)
    text = _summary(config, records, suites, workdir, machine, dtype, peaks, bws, specs_hw)
    print("\n" + text, flush=True)

    out = out or os.path.join(workdir, f"{config.name}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with workdirs.open_new(out) as f:
        json.dump(records, f, indent=1)
    with workdirs.open_new(os.path.join(workdir, f"{config.name}.md")) as f:
        f.write(text + "\n")
    print(f"\nresults: {out}", flush=True)
    return records


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"
