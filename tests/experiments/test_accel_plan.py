"""The device run's plan (`experiments.bench.accel_plan`, `accel_bench.py --plan`), made on a
CPU before a GPU is booked: records in order, each fitting the device or skipped with the
reason, the run inside its 8 minutes, the wheels checked first."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from experiments.bench import accel_plan as ap
from experiments.bench import bench_accel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GiB = ap.GiB


def _rows(plan, part=None):
    return [r for r in plan["rows"] if part in (None, r["part"])]


def test_the_committed_plan_compares_the_three_families_where_all_fit():
    """GDN needs 139 GiB at B = 128 and 71 GiB (H100's compile) or 76 GiB (H200's) at 64: the
    H100 (59.4 GiB usable) compares at 32, the H200 (105.3 GiB) at 64; every planned record
    fits, the others say why not, with the peak of the kind's own compile."""
    for kind, batch in (("h100", 32), ("h200", 64)):
        plan = bench_accel.plan(kind)
        assert plan["compare_batch"] == batch
        runs = [r for r in _rows(plan) if not r.get("skip")]
        assert [r["record"].family for r in runs[:3]] == ["gpn_m", "transformer", "gdn"]
        assert {r["record"].batch for r in runs[:3]} == {batch}
        assert runs[1]["record"].attention == "cudnn"
        assert all(r["fits"] and r["peak_bytes"] <= plan["usable_bytes"] for r in runs)
        gdn128 = next(r for r in _rows(plan) if r["record"] == ap.Record("gdn", 128))
        need, usable = gdn128["peak_bytes"] / GiB, plan["usable_bytes"] / GiB
        assert gdn128["skip"] == f"needs {need:.1f} GiB, {usable:.1f} usable" and need > usable
        assert gdn128["memory_source"] == f"{kind} compile"
        run, rerun = ap.totals(plan)
        assert run <= ap.RUN_S < 8 * 60 and rerun <= 3 * 60
        assert "same tokens per step at B = " + str(batch) in ap.describe(plan)


def test_a_record_measured_on_the_same_kind_is_not_measured_again():
    h100, h200 = bench_accel.plan("h100"), bench_accel.plan("h200")
    rec = ap.Record("gpn_m", 128, "pallas", "bfloat16")
    (r100,) = [r for r in _rows(h100, "step") if r["record"] == rec]
    (r200,) = [r for r in _rows(h200, "step") if r["record"] == rec]
    assert r100["skip"] == "measured before (accel_h100_step.json)"
    assert not r200.get("skip")  # measured on an H100 only: its peak and rate serve


def test_memory_estimates_prefer_points_then_the_step_memory_model():
    key = ap.Record("gdn", 32).key()
    two = {key: {32: (10 * GiB, "compile"), 64: (18 * GiB, "compile")}}
    assert ap.estimate(ap.Record("gdn", 32), two) == (10 * GiB, "compile")
    peak, source = ap.estimate(ap.Record("gdn", 128), two)  # the line 2 + B / 4 GiB
    assert peak == pytest.approx(34 * GiB, rel=1e-12) and "line" in source
    one = {key: {64: (18 * GiB, "compile")}}
    assert ap.estimate(ap.Record("gdn", 32), one)[0] == 18 * GiB  # never more below B0
    assert ap.estimate(ap.Record("gdn", 128), one)[0] == 36 * GiB  # at most in proportion
    bf16 = {ap.Record("gpn_m", 128, "pallas", "bfloat16").key(): {128: (21 * GiB, "run")}}
    f32 = ap.estimate(ap.Record("gpn_m", 128, "pallas", "float32"), bf16)
    assert f32[0] == 42 * GiB and f32[1].startswith("twice bfloat16's")
    assert ap.estimate(ap.Record("transformer", 8, attention="cudnn"), {})[0] is None
    # the loops as CUDA graphs or unrolled: the same step's figure, until compiled or measured
    for loops in ({"graphs": ap.GRAPHS}, {"unroll": ap.UNROLLED}):
        rec = ap.Record("gpn_m", 128, "pallas", "bfloat16", **loops)
        assert ap.estimate(rec, bf16) == (21 * GiB, "run")


def test_records_past_the_run_or_the_memory_are_skipped_with_the_reason(tmp_path):
    """No point for any family: nothing can be shown to fit, so no comparison is planned."""
    plan = ap.make("h100", str(tmp_path))
    assert plan["compare_batch"] is None
    assert all(r["skip"].startswith("no memory estimate") for r in _rows(plan))
    compiles = {  # `gpn_jax.aot --topology=h100 --batches=8 --out=...`'s trials
        "gpn_m": ({"kernels": "pallas", "memory_dtype": "bfloat16", "attention": None}, 1),
        "transformer": ({"kernels": "xla", "memory_dtype": "float32", "attention": "cudnn"}, 1),
        "gdn": ({"kernels": "xla", "memory_dtype": "float32", "attention": None}, 70),
    }
    for family, (fields, gib) in compiles.items():
        trial = fields | {"batch_per_device": 8, "peak_bytes_per_device": gib * GiB}
        (tmp_path / f"aot_130m_h100_{family}.json").write_text(json.dumps({"trials": [trial]}))
    plan = ap.make("h200", str(tmp_path))  # the H100's compiles: the same sm_90 program
    assert plan["compare_batch"] == 8  # GDN's 70 GiB at 8 bounds every larger batch
    skipped = [r for r in _rows(plan, "baselines") if r.get("skip")]
    assert [r["record"].batch for r in skipped] == [128, 64, 32, 16]  # GDN only
    assert skipped[-1]["skip"] == "needs 140.0 GiB, 105.3 usable"
    sweep = _rows(plan, "step")
    assert sweep[-2]["record"].memory_dtype == "float32"  # then at once, one token an iteration
    assert (sweep[-1]["record"].rerun, sweep[-1]["record"].unroll) == (ap.AT_ONCE, "-")
    assert any(r.get("skip", "").startswith("past the run's") for r in sweep)
    settings = ap.settings_records(plan, "baselines")
    assert [r["family"] for r in settings] == ["gpn_m", "transformer", "gdn"]
    assert all(r["batch"] == 8 and r["seconds"] > 0 for r in settings)


def test_the_device_settings_follow_the_plan_with_a_compile_cache():
    s = bench_accel.settings("device", kind="h100")
    assert s["batch_size"] == 32 and s["seq_len"] == 2048
    assert [(r["family"], r["batch"]) for r in s["baseline_records"]] == [
        ("gpn_m", 32), ("transformer", 32), ("gdn", 32),
    ]  # fmt: skip
    # first the step rerun at once at 128 with its loops unrolled, then the same with them as
    # CUDA graphs (XLA flags for its worker only); token by token it was measured on an H100
    first, graphs = s["step_records"][:2]
    assert (first["batch"], first["rerun"], first["model_fields"]["remat_parallel"]) == (
        128, "rerun at once", True,
    )  # fmt: skip
    assert first["model_fields"]["scan_unroll"] == ap.UNROLL
    assert first["xla_flags"] is None and graphs["graphs"] == ap.GRAPHS
    assert graphs["xla_flags"] == ap.GRAPHS_XLA_FLAGS and "WHILE" in graphs["xla_flags"]
    assert {k: v for k, v in graphs.items() if k not in ("graphs", "xla_flags")} == {
        k: v for k, v in first.items() if k not in ("graphs", "xla_flags")
    }
    assert not [  # token by token at 128 it was measured before
        r for r in s["step_records"]
        if (r["batch"], r["memory_dtype"], r["rerun"]) == (128, "bfloat16", "-")
    ]  # fmt: skip
    # float32 memory beside bfloat16's at the same batch (the comparison's), both in this run
    f32 = [r for r in s["step_records"] if r["memory_dtype"] == "float32"]
    assert f32 and all(r["batch"] == ap.FLOAT32_BATCH for r in f32)
    gpn = [r for r in s["baseline_records"] + s["step_records"] if r["family"] == "gpn_m"]
    assert any(r["batch"] == ap.FLOAT32_BATCH and r["memory_dtype"] == "bfloat16" for r in gpn)
    assert s["env"]["JAX_COMPILATION_CACHE_DIR"].endswith(os.path.join("runs", "jax_cache"))


def test_the_dry_run_checks_the_wheels_first_and_prints_the_plan(tmp_path):
    cmd = [sys.executable, "experiments/bench/accel_bench.py", "--plan=h100"]
    p = subprocess.run(
        cmd + [f"--wheels={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 1 and p.stderr.count("\n") <= 1
    assert p.stderr.startswith(f"accel_bench: error: {tmp_path}: no wheel file;"), p.stderr
    (tmp_path / "ml_collections-1.1.0-py3-none-any.whl").write_bytes(b"")
    p = subprocess.run(
        cmd + [f"--wheels={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    assert "same tokens per step at B = 32" in p.stdout and "estimate:" in p.stdout


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_stopped_run_kills_the_part_and_its_children(tmp_path):
    """The outer `timeout` stops the run with SIGTERM: the part running then (in a session of
    its own) and what it started are killed with it, not left holding the device."""
    part = tmp_path / "part"
    part.write_text("#!/bin/sh\nsleep 120 &\necho pids $$ $!\nwait\n")
    part.chmod(0o755)
    code = (
        "import sys; from experiments.bench import accel; accel.stop_on_signals(); "
        f"accel.sys.executable = {str(part)!r}; "
        f"accel.run_part('check', 's.json', {str(tmp_path / 'o.json')!r}, {str(tmp_path)!r}, 120)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )  # fmt: skip
    line = ""
    while "pids" not in line:
        line = proc.stdout.readline()
        assert line, "the part printed nothing"
    pids = [int(x) for x in line.split()[1:]]
    assert all(_alive(p) for p in pids)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def test_a_record_s_xla_flags_reach_its_worker_process_only(monkeypatch):
    """The CUDA-graphs record's flags go into its own worker's XLA_FLAGS, after the run's; a
    spec with flags is refused in-process, where XLA has read its flags already."""
    from gpn_jax.benchmarks import orchestrate

    seen = {}

    def fake_run(cmd, env, **kw):
        seen["env"] = env
        raise RuntimeError("stop here")

    monkeypatch.setattr(orchestrate.subprocess, "run", fake_run)
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    spec = {"name": "gpn_m", "xla_flags": ap.GRAPHS_XLA_FLAGS}
    with pytest.raises(RuntimeError, match="stop here"):
        orchestrate.run_spec(spec, isolate=True)
    assert seen["env"]["XLA_FLAGS"] == f"--xla_dump_to=/tmp/x {ap.GRAPHS_XLA_FLAGS}"
    assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/x"
    with pytest.raises(ValueError, match="sets xla_flags: run it in its own process"):
        orchestrate.run_spec(spec, isolate=False)


def test_an_unrolled_record_takes_its_steps_rate_and_a_longer_compile():
    one = ap.Record("gpn_m", 128, "pallas", "bfloat16")
    rates = {one.key(): (100_000.0, 20.0)}  # tokens/s, compile seconds
    unrolled = dataclasses.replace(one, unroll=ap.UNROLLED)
    (s1, _), (s4, source) = ap.seconds(one, rates), ap.seconds(unrolled, rates)
    assert s4 - s1 == pytest.approx(20.0 * (ap.UNROLLED_COMPILE - 1), rel=1e-12)
    assert source == "measured rate"
    assert ap.seconds(unrolled, rates, cached=True) == ap.seconds(one, rates, cached=True)
