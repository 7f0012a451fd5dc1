"""The prepared accelerator run (`experiments/bench/accel_bench.py`): its rehearsal runs every part
here (the Pallas kernels interpreted) and writes every field, without the packages a lent
machine's image lacks; the device settings, budgets and the one-line command fit the machine."""

import json
import os
import subprocess
import sys

import pytest

from experiments.bench import bench_accel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# what the H200 image does not have and the run does not carry (experiments/bench/README.md)
ABSENT = ("grain", "tensorflow_datasets", "array_record", "tensorboardX")
BLOCKER = f"""
import importlib.abc, sys
class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {ABSENT!r}:
            raise ImportError(f"{{name}} is not on the lent machine's image")
sys.meta_path.insert(0, _Absent())
"""
PASSES = ("step", "stack", "grad")


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """One rehearsal, its output folder and log."""
    site, out = tmp_path_factory.mktemp("site"), tmp_path_factory.mktemp("accel") / "out"
    (site / "sitecustomize.py").write_text(BLOCKER)
    tmp = tmp_path_factory.mktemp("tmpdir")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), ROOT]), TMPDIR=str(tmp))
    env.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
    p = subprocess.run(
        [sys.executable, "experiments/bench/accel_bench.py", "--rehearse", f"--out={out}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    return out, p.stdout, tmp


def _load(out, name):
    return json.loads((out / name).read_text())


@pytest.mark.slow
def test_the_rehearsal_runs_every_part_and_writes_at_most_8_files_and_removes_its_scratch(
    rehearsal,
):
    out, log, tmp = rehearsal
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("accel-scratch-")]
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        [
            "versions.json",
            "check.json",
            "passes.json",
            "step.json",
            "baselines.json",
            "hlo.json",
            "train_step.hlo.txt",
        ]
    )  # fmt: skip  (the eighth, log.txt, is h200_run.sh's)
    versions = _load(out, "versions.json")
    assert versions["preallocate"] == "false" and versions["packages"]["jax"]
    assert {p: r["status"] for p, r in versions["parts"].items()} == dict.fromkeys(
        ["versions", "check", "passes", "step", "baselines", "hlo"], "ok"
    )
    assert "accel_bench: versions ok, baselines ok, check ok, step ok, passes ok, hlo ok" in log


@pytest.mark.slow
def test_the_check_part_compares_every_pass_and_five_training_steps(rehearsal):
    check = _load(rehearsal[0], "check.json")
    got = {(r["memory_dtype"], r["pass"]) for r in check["passes"] if r["ok"]}
    assert got == {(d, n) for d in ("float32", "bfloat16") for n in PASSES}
    assert all(0 <= r["rel_err"] <= r["bound"] for r in check["passes"])
    train = check["train"]
    assert len(train["losses"]["xla"]) == len(train["losses"]["pallas"]) == 5
    assert train["ok"] and max(train["rel_diff"]) <= train["bound"] == 2.0**-23 * 16 * 32 * 4


@pytest.mark.slow
def test_the_passes_part_times_each_pass_against_the_copy_bandwidth(rehearsal):
    passes = _load(rehearsal[0], "passes.json")
    assert passes["copy_bandwidth_gb_per_s"] > 0
    keys = {(r["memory_dtype"], r["pass"], r["backend"]) for r in passes["rows"]}
    assert keys == {
        (d, n, b) for d in ("float32", "bfloat16") for n in PASSES for b in ("xla", "pallas")
    }
    assert all(
        r["us_per_token"] > 0 and r["fraction_of_copy_bandwidth"] > 0 for r in passes["rows"]
    )


@pytest.mark.slow
def test_the_step_and_baseline_parts_record_speed_memory_and_loop_ops(rehearsal):
    out = rehearsal[0]
    step, base = _load(out, "step.json"), _load(out, "baselines.json")
    kinds = [(r["kernels"], r["memory_dtype"], r.get("rerun")) for r in step["records"]]
    assert kinds == [("pallas", "bfloat16", "rerun at once"), ("xla", "float32", None)]
    assert [r["family"] for r in base["records"]] == ["gpn_m", "transformer", "gdn"]
    gpn = [r for r in step["records"] + base["records"] if r["family"] == "gpn_m"]
    for r in step["records"] + base["records"]:
        assert r.get("error") is None, r
        assert r["tokens_per_s"] > 0 and 0 < r["mfu"] and r["peak_mem_bytes"] > 0
        assert r["batch_size"] == 2 and r["seq_len"] == 16 and r["ops_per_token"] > 0
    assert all(r["backward_ops_per_token"] > 0 for r in gpn)
    assert base["tokens_per_step"] == 2 * 16


@pytest.mark.slow
def test_the_hlo_part_writes_the_optimised_hlo_its_loop_ops_and_a_profile(rehearsal):
    out = rehearsal[0]
    hlo = _load(out, "hlo.json")
    text = (out / "train_step.hlo.txt").read_text()
    assert text.startswith("HloModule") and hlo["hlo_chars"] == len(text)
    assert hlo["ops_per_token"] == hlo["forward_ops_per_token"] + hlo["backward_ops_per_token"]
    assert hlo["per_token_loops"] and "| inside |" in hlo["profile_ops_md"]
    assert 0 < hlo["memory_bytes_per_token_hlo"] < hlo["bytes_per_token_hlo"]  # the summary's
    assert hlo["hlo_source"] == "the comparison's GPN+M record"  # saved, not recompiled


def test_device_settings_are_the_130m_models_in_order_of_value_within_8_minutes():
    """The records and their budgets are the plan's (`tests/experiments/test_accel_plan.py`)."""
    s = bench_accel.settings("device", kind="h100")
    assert s["seq_len"] == 2048
    assert s["models"]["gpn_m"]["d_model"] == 2496 and s["models"]["gdn"]["family"] == "gdn"
    assert s["baseline_records"][0] == bench_accel.gpn_record(
        "pallas", "bfloat16", s["batch_size"], s["baseline_records"][0]["seconds"]
    )
    assert list(s["budgets"]) == ["smoke", "check", "passes", "step", "baselines", "hlo"]
    parts = ("check", "passes", "step", "baselines", "hlo")
    assert sum(s["budgets"][p] for p in parts) <= 480
    assert s["pass_dims"] == (128, 15, 128, 256, 16)
    with pytest.raises(ValueError, match="unknown mode 'tpu'"):
        bench_accel.settings("tpu")


def test_the_h200_command_fits_the_device_tool():
    script = open(os.path.join(ROOT, "experiments/bench/h200_run.sh")).read()
    assert len(script) <= 2000
    lines = [ln for ln in script.splitlines() if ln and not ln.startswith("#")]
    assert lines[0].startswith("export XLA_PYTHON_CLIENT_PREALLOCATE=false")
    assert "--no-index --no-deps" in script and "--target /tmp/site .whl/*.whl" in script
    assert "accel_bench.py ${ACCEL_ARGS:---device}" in script and 'tee "$OUT/log.txt"' in script


def test_the_h200_command_stops_in_one_line_without_wheels(tmp_path):
    """Without .whl/ (not downloaded in the calling checkout) it stops before installing."""
    script = os.path.join(ROOT, "experiments/bench/h200_run.sh")
    p = subprocess.run(
        ["bash", script], cwd=tmp_path, env=dict(os.environ, OUT=str(tmp_path / "out")),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 2 and p.stdout == ""
    assert (
        p.stderr.startswith("h200_run: error: .whl/: no wheel file;") and p.stderr.count("\n") == 1
    )


def test_one_mode_is_required():
    p = subprocess.run(
        [sys.executable, "experiments/bench/accel_bench.py", "--out=/nonexistent/x"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode != 0
    assert "pass exactly one of --device (the accelerator run) and --rehearse" in p.stderr


def test_a_part_past_its_deadline_is_killed_and_what_it_printed_is_kept():
    """A part that ends no line and hangs cannot hold the run: its process group is killed at
    the deadline, the lines it printed are kept."""
    import select
    import time

    from experiments.bench import accel

    code = "import sys, time; print('row 1', flush=True); sys.stdout.write('half'); "
    code += "sys.stdout.flush(); time.sleep(120)"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    # the deadline counts from the child's first output: a loaded host may take seconds to
    # start Python, and a deadline that passes before it prints would test nothing
    select.select([proc.stdout], [], [], 120)
    assert accel._follow(proc, time.monotonic() + 2) == (["row 1"], True)
    assert proc.poll() is not None


@pytest.mark.parametrize(
    "body, status", [("sleep 120", "timeout"), ("exit 3", "failed"), ("exit 0", "ok")]
)
def test_a_part_is_recorded_as_it_ended(tmp_path, monkeypatch, body, status):
    """A part killed at its deadline reads 'timeout' (not the 0 that Popen's own wait reports
    for a child already reaped), one that exits non-zero 'failed'."""
    from experiments.bench import accel

    part = tmp_path / "part"
    part.write_text(f"#!/bin/sh\necho row 1\n{body}\n")
    part.chmod(0o755)
    monkeypatch.setattr(accel.sys, "executable", str(part))  # the part's interpreter
    rec = accel.run_part("check", "s.json", str(tmp_path / "o.json"), str(tmp_path), 1.5)
    assert rec["status"] == status
    assert rec.get("tail", ["row 1"]) == ["row 1"]


def test_each_row_is_saved_as_it_comes(tmp_path):
    from experiments.bench.accel_parts import Out

    out = Out(str(tmp_path / "part.json"), part="step")
    out.add("records", {"tokens_per_s": 1.0})
    assert json.loads((tmp_path / "part.json").read_text()) == {
        "part": "step",
        "records": [{"tokens_per_s": 1.0}],
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part.json"]
