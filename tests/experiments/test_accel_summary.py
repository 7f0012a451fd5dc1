"""The accelerator run's result files (`experiments.bench.accel_summary`): every record is a row,
one that failed, timed out or was not reached says so instead of a number, a part cut off at its
deadline is named, the folder is read as untrusted data, and the committed H100 summary is what
its committed folder gives. Also the targeted-rerun settings (`--budgets`, `--step_records`)."""

import importlib.util
import json
import os

import pytest

from experiments.bench import accel_summary, bench_accel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H100 = os.path.join("experiments", "results", "accel_h100")
_SPEC = importlib.util.spec_from_file_location(
    "render_results", os.path.join(ROOT, "tools", "render_results.py")
)
render_results = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(render_results)
TIMEOUT = "TimeoutExpired: Command '[python, -m, worker]' timed out after 44 seconds"


def _record(**kw) -> dict:
    base = {"batch_size": 8, "seq_len": 64, "tokens_per_s": 1000.0, "step_time_s": 0.5}
    return base | {"mfu": 0.25, "peak_mem_bytes": 2**30, "ops_per_token": 80.0} | kw


def _folder(tmp_path, finished=("versions", "step", "baselines", "check")) -> str:
    parts = {
        "versions": {"mode": "device", "device_kind": "GPU X", "platform": "gpu",
                     "started": 0, "packages": {"jax": "0.11.2"},
                     "parts": {p: {"status": "ok"} for p in ("check", "step", "hlo")}},
        "step": {"seq_len": 64, "records": [
            _record(kernels="pallas", memory_dtype="bfloat16", compile_s=3.0),
            {"kernels": "pallas", "memory_dtype": "float32", "batch_size": 8, "error": TIMEOUT},
            {"kernels": "xla", "memory_dtype": "float32", "batch_size": 8,
             "skipped": "out of time"},
        ]},
        "baselines": {"records": [_record(family="transformer"), {"family": "gdn",
                                                                  "error": "OOM"}]},
        "check": {"passes": [{"memory_dtype": "float32", "pass": "step", "ok": True,
                              "rel_err": 1e-7, "bound": 1e-4}],
                  "train": {"rel_diff": [0.0, 1e-6], "bound": 1e-3, "ok": True}},
        "hlo": {},
    }  # fmt: skip
    for name, data in parts.items():
        data |= {"finished": 1} if name in finished else {}
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    return str(tmp_path)


def test_each_record_is_a_row_and_what_did_not_run_says_so(tmp_path):
    step, check = accel_summary.summarise(_folder(tmp_path))
    outcomes = [(r["model"], r["outcome"]) for r in step["rows"]]
    assert outcomes == [
        ("GPN+M 130M", "ok"),
        ("GPN+M 130M", "timed out (the 44 s left in the part)"),
        ("GPN+M 130M", "not run: the part's budget was spent"),
        ("Transformer++ 130M", "ok"),
        ("Gated DeltaNet 130M", "OOM"),
    ]
    first = step["rows"][0]
    assert (first["tokens_per_s"], first["mfu_pct"], first["peak_mem_gib"]) == (1000.0, 25.0, 1.0)
    assert all(r["tokens_per_s"] is None for r in step["rows"][1:3] + step["rows"][4:])
    assert step["rows"][1]["seq_len"] == 64  # the part's window where the record has none
    assert step["parts"] == {"check": "ok", "step": "ok", "hlo": "cut off at its deadline"}
    assert [r["ok"] for r in check["rows"]] == ["yes", "yes"]
    assert check["rows"][1]["rel_err"] == 1e-6
    assert step["machine"] == "GPU X (gpu)" and step["date"] == "1970-01-01"


def test_rows_that_did_not_run_render_as_dashes(tmp_path):
    step, _ = accel_summary.summarise(_folder(tmp_path))
    table = render_results.table("accel_h100_step", step, ROOT, ROOT)
    row = next(ln for ln in table.splitlines() if "timed out" in ln)
    assert row.count("| — ") == 7 and "None" not in table  # 6 figures, XLA's default loops


def test_a_missing_or_malformed_part_file_is_one_line_naming_it(tmp_path):
    folder = _folder(tmp_path)
    os.unlink(os.path.join(folder, "check.json"))
    with pytest.raises(ValueError, match=r"check\.json: missing; pass the folder"):
        accel_summary.summarise(folder)
    (tmp_path / "check.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"check\.json: not a JSON object"):
        accel_summary.summarise(folder)
    (tmp_path / "step.json").write_bytes(b"{" + b" " * accel_summary.MAX_BYTES + b"}")
    with pytest.raises(ValueError, match=r"step\.json: larger than 16 MiB"):
        accel_summary.summarise(folder)


def test_the_hlo_file_the_hlo_part_names_stays_in_its_folder(tmp_path):
    """The summary reads what the step moves off the HLO the `hlo` part saved; a name that
    leaves the folder is one line naming the field, and no HLO there is no figure."""
    folder = _folder(tmp_path)
    hlo = {"hlo_file": "../elsewhere.hlo.txt", "batch_size": 8, "finished": 1}
    (tmp_path / "hlo.json").write_text(json.dumps(hlo))
    with pytest.raises(ValueError, match=r"hlo\.json: hlo_file '\.\./elsewhere\.hlo\.txt' leaves"):
        accel_summary.summarise(folder)
    (tmp_path / "hlo.json").write_text(json.dumps(hlo | {"hlo_file": "train_step.hlo.txt"}))
    assert accel_summary.summarise(folder)[0]["compiled"] is None


def test_the_committed_h100_summary_is_what_its_folder_gives(monkeypatch):
    """experiments/results/accel_h100_{step,check}.json, rewritten from the committed folder."""
    monkeypatch.chdir(ROOT)  # the files name the folder as the command was given it
    stem = os.path.join("experiments", "results", "accel_h100")
    for suffix, data in zip(("step", "check"), accel_summary.summarise(H100, stem), strict=True):
        with open(os.path.join(ROOT, f"{stem}_{suffix}.json")) as f:
            assert json.load(f) == json.loads(json.dumps(data)), suffix


def test_a_targeted_rerun_overrides_budgets_and_step_records():
    s = bench_accel.settings("device", ["baselines=150", "step=90"], ["pallas:float32:128"])
    assert s["budgets"]["baselines"] == 150 and s["budgets"]["step"] == 90
    assert s["budgets"]["check"] == bench_accel.DEVICE_BUDGETS["check"]
    assert [(r["kernels"], r["memory_dtype"], r["batch"]) for r in s["step_records"]] == [
        ("pallas", "float32", 128)
    ]
    graphs = bench_accel.settings("device", [], ["pallas:bfloat16:128:at_once:graphs"])
    (rec,) = graphs["step_records"]
    assert (rec["rerun"], rec["graphs"], rec["model_fields"]["remat_parallel"]) == (
        "rerun at once", "CUDA graphs", True,
    )  # fmt: skip
    assert "WHILE" in rec["xla_flags"]
    for bad in ("pallas:bfloat16:128:fast", "pallas:bfloat16:128:graphs:graphs"):
        with pytest.raises(ValueError, match=r"write KERNELS:MEMORY_DTYPE:BATCH\[:at_once\]"):
            bench_accel.settings("device", [], [bad])
    with pytest.raises(ValueError, match="--budgets entry 'bogus=1': write PART=SECONDS"):
        bench_accel.settings("device", ["bogus=1"])
    with pytest.raises(ValueError, match="--budgets entry 'step=-5'"):
        bench_accel.settings("device", ["step=-5"])
    with pytest.raises(ValueError, match="--step_records entry 'pallas:float16:8'"):
        bench_accel.settings("device", (), ["pallas:float16:8"])
