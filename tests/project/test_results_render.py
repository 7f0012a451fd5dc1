"""tools/render_results.py: the docs' tables are their result files, and bad files stop it in
one line before any page is written."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools", "render_results.py")


def _module():
    spec = importlib.util.spec_from_file_location("render_results", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render = _module()

PAGE = "# Page\n\nbefore\n\n<!-- results:toy -->\nstale\n<!-- /results:toy -->\n\nafter\n"
TOY = {
    "command": "python -m toy --out=toy.json",
    "date": "a date",
    "machine": "a machine",
    "version": "0",
    "rows": [{"name": "a", "value": 1}, {"name": "b|c", "value": 2.5}],
}


def _repo(tmp_path, result=TOY, page=PAGE):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(page)
    (tmp_path / "README.md").write_text("# readme\n")
    results = tmp_path / "experiments" / "results"
    results.mkdir(parents=True)
    if result is not None:
        (results / "toy.json").write_text(result if isinstance(result, str) else json.dumps(result))
    return tmp_path


def _cli(root, *args):
    return subprocess.run(
        [sys.executable, SCRIPT, f"--root={root}", *args], capture_output=True, text=True
    )


def test_the_committed_tables_equal_their_result_files():
    proc = _cli(ROOT, "--check")
    assert proc.returncode == 0, proc.stderr


def test_every_result_file_records_its_provenance_and_is_shown_somewhere():
    """Each file has its own table, or is a member of a collection (one table over several
    files, e.g. `gpn_jax.aot`'s compiles) or of a table computed from several files (DERIVED)
    whose table is shown."""
    results = os.path.join(ROOT, render.RESULTS)
    names = sorted(f[:-5] for f in os.listdir(results) if f.endswith(".json"))
    assert names
    shown = "".join(open(p, encoding="utf-8").read() for p in render.pages(ROOT))
    in_collection = {m: c for c, members in render.COLLECTIONS.items() for m in members}
    in_derived = {  # the files a shown table computed from several files reads
        os.path.basename(m)[:-5]
        for d, table in render.DERIVED.items()
        if f"<!-- results:{d} -->" in shown
        for m in table(ROOT)["members"]
    }
    for name in names:
        if name in in_derived and name not in in_collection:
            data = render.load(ROOT, name)
            for key in ("command", "date", "machine", "version"):
                assert isinstance(data[key], str) and data[key].strip(), (name, key)
            continue
        if name in in_collection:
            data = render.load(ROOT, name, required=("command", "date", "machine"))
            version = data.get("version") or data.get("gpn_jax_version")
            assert isinstance(version, str) and version.strip(), (name, "version")
            markers = [c for c, ms in render.COLLECTIONS.items() if name in ms]
            assert any(f"<!-- results:{c} -->" in shown for c in markers), name
            continue
        data = render.load(ROOT, name)
        for key in ("command", "date", "machine", "version"):
            assert isinstance(data[key], str) and data[key].strip(), (name, key)
        assert f"<!-- results:{name} -->" in shown, f"{name}.json is rendered on no page"


def test_the_aot_limits_are_the_largest_fitting_and_smallest_failing_batches(monkeypatch):
    rows = render.load_collection(ROOT, "aot_130m_limits")["rows"]
    assert {"h100", "h200"} < {r["topology"] for r in rows}  # the GPUs' rows are there
    monkeypatch.setitem(render.COLLECTIONS, "every_trial", render.COLLECTIONS["aot_130m_limits"])
    every = render.load_collection(ROOT, "every_trial")["rows"]
    for row in rows:
        trials = [r for r in every if r["topology"] == row["topology"]]
        fit = [r["batch_per_device"] for r in trials if r["fits"]]
        fail = [r["batch_per_device"] for r in trials if not r["fits"]]
        assert row["largest_fitting"] == max(fit) < min(fail) == row["smallest_failing"]


def test_render_writes_the_table_and_check_then_passes(tmp_path):
    root = _repo(tmp_path)
    assert _cli(root, "--check").returncode == 1
    assert _cli(root).returncode == 0
    text = (root / "docs" / "page.md").read_text()
    table = (
        "<!-- results:toy -->\n"
        "| name | value |\n"
        "|---|---|\n"
        "| a | 1 |\n"
        "| b\\|c | 2.5 |\n"
        "\n"
        "<sub>Data: [experiments/results/toy.json](../experiments/results/toy.json).</sub>\n"
        "<!-- /results:toy -->"
    )
    assert text == PAGE.replace("<!-- results:toy -->\nstale\n<!-- /results:toy -->", table)
    assert _cli(root, "--check").returncode == 0


def test_a_changed_value_fails_the_check_and_names_the_page(tmp_path):
    root = _repo(tmp_path)
    assert _cli(root).returncode == 0
    changed = dict(TOY, rows=[{"name": "a", "value": 1}, {"name": "b|c", "value": 2.6}])
    (root / "experiments" / "results" / "toy.json").write_text(json.dumps(changed))
    proc = _cli(root, "--check")
    assert proc.returncode == 1
    assert "docs/page.md" in proc.stderr
    assert "2.6" not in (root / "docs" / "page.md").read_text()  # --check writes nothing


def test_known_columns_format_the_rows():
    data = {"rows": [{"change": "x", "ratio": 0.8681, "faster": "16 of 16"}]}
    text = render.table("memory_kernels_ab", data, "/r/docs", "/r")
    assert "| x | ×0.868 | 16 of 16 |" in text
    assert "|---|---:|---:|" in text


@pytest.mark.parametrize(
    "result, message",
    [
        (None, "experiments/results/toy.json: no such result file"),
        ("{not json", "experiments/results/toy.json: not valid JSON"),
        ("[1, 2]", "experiments/results/toy.json: top level must be an object"),
        ({"rows": [{"a": 1}]}, "experiments/results/toy.json: missing command, date, machine"),
        (dict(TOY, rows=[]), "experiments/results/toy.json: 'rows' must be a non-empty list"),
        (dict(TOY, rows=[1]), "experiments/results/toy.json: 'rows' must be a non-empty list"),
        ("x" * (render.MAX_BYTES + 1), "experiments/results/toy.json: larger than"),
    ],
    ids=["missing", "not-json", "not-object", "no-provenance", "no-rows", "bad-row", "huge"],
)
def test_a_bad_result_file_is_one_line_and_nothing_is_written(tmp_path, result, message):
    root = _repo(tmp_path, result=result)
    proc = _cli(root)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert message in proc.stderr
    assert (root / "docs" / "page.md").read_text() == PAGE


def test_a_row_that_does_not_fit_the_columns_is_one_line(tmp_path):
    page = PAGE.replace("results:toy", "results:memory_kernels_ab")
    root = _repo(tmp_path, page=page)
    os.rename(root / render.RESULTS / "toy.json", root / render.RESULTS / "memory_kernels_ab.json")
    proc = _cli(root)
    assert proc.returncode == 2
    assert "memory_kernels_ab.json: row 0 does not fit the table (KeyError" in proc.stderr


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "Toy", "a.b"])
def test_a_marker_cannot_name_a_file_outside_the_results_folder(tmp_path, name):
    root = _repo(tmp_path, page=PAGE.replace("results:toy", f"results:{name}"))
    proc = _cli(root)
    assert proc.returncode == 2
    assert f"marker names result {name!r}: use [a-z0-9_]+" in proc.stderr


def test_format_fields_are_plain_names_only():
    with pytest.raises(render.ResultError, match="does not fit the table"):
        render.COLUMNS["probe"] = [("x", "{value.__class__}", "l")]
        try:
            render.table("probe", {"rows": [{"value": 1}]}, "/r", "/r")
        finally:
            del render.COLUMNS["probe"]


def test_the_h100_time_split_adds_up_to_the_measured_step_and_backs_the_docs():
    """The split's parts and what they leave add up to the measured step, and the figures the
    page states next to it (70 % of the bound, the time to take out, the memory's excess over
    its minimum) follow from the same files."""
    rows = render.DERIVED["accel_h100_time"](ROOT)["rows"]
    measured = rows[-1]["us_per_token"]
    assert sum(r["us_per_token"] for r in rows[:-1]) == pytest.approx(measured, rel=1e-12)
    assert all(r["us_per_token"] > 0 for r in rows)  # every floor below the measured step
    step = render.load(ROOT, "accel_h100_step")
    roofline = next(r for r in render.load(ROOT, "roofline_130m")["rows"]
                    if (r["batch_per_chip"], r["memory_dtype"]) == (128, "bfloat16"))  # fmt: skip
    target = 1e6 / (0.7 * roofline["h100"])
    text = open(os.path.join(ROOT, "docs", "performance.md"), encoding="utf-8").read()
    assert f"about {target:.1f} µs per token at B = 128" in text
    assert f"some\n{measured - target:.1f} µs out of the step" in text
    trials = render.load(ROOT, "aot_130m_h100_gpn_m", required=("command",))["trials"]
    at128 = next(t for t in trials if t["batch_per_device"] == 128)
    program = step["compiled"]  # the run's own: its memory moves what today's compile moves
    assert program["memory_bytes_per_token_hlo"] == at128["memory_bytes_per_token_hlo"]
    excess = program["memory_bytes_per_token_hlo"] - at128["memory_bytes_per_token_min"]
    assert excess / (step["copy_bandwidth_gb_per_s"] * 1e9) * 1e6 < 0.5  # "loses under 0.5 µs"
    assert f"measured ({step['copy_bandwidth_gb_per_s'] / 1e3:.2f} TB/s)" in text
    assert f"instead of {program['ops_per_token']:.0f} operations" in text


def test_the_rerun_at_once_backs_what_the_page_says_of_it():
    """The page says of `remat_parallel`'s compile against the step token by token (the H100
    run's program and today's compile): every floor set by bytes and launches is lower, for
    some 6 GiB more memory, and the sum of the floors is still above 70 % of the bound for its
    bytes; and how many operations per token step fewer today's token-by-token step launches
    than the run's program."""
    rows = render.DERIVED["accel_h100_rerun"](ROOT)["rows"]
    floors, total, target, ops, peak = rows[:3], rows[4], rows[5], rows[6], rows[7]
    for before in ("run", "token_by_token"):
        assert all(r["at_once"] < r[before] for r in floors)
        assert round(peak["at_once"] - peak[before]) == 6
    assert total["at_once"] == pytest.approx(sum(r["at_once"] for r in rows[:4]), rel=1e-12)
    assert total["at_once"] > target["at_once"]
    text = open(os.path.join(ROOT, "docs", "performance.md"), encoding="utf-8").read()
    assert "Every floor that bytes and launches set is lower at once, for some 6 GiB" in text
    assert "still above 70 % of the bound for its bytes" in text
    fewer = ops["run"] - ops["token_by_token"]
    assert fewer == round(fewer) > 0
    assert f"today's step compiles to {fewer:.0f} operations per token\nstep fewer" in text


def test_the_unrolled_loops_back_what_the_page_says_of_them():
    """The step rerun at once with 4 tokens per loop iteration, compiled for an H100: fewer
    operations per token step than one token per iteration, the same peak, and the sum of its
    floors (as the rerun table's) that the page states against 70 % of the bound."""
    from gpn_jax.benchmarks import roofline

    step, run = render._h100_run(ROOT)
    unrolled = render._at_128(ROOT, "aot_130m_h100_gpn_m_at_once_unroll4")
    one = render._at_128(ROOT, "aot_130m_h100_gpn_m_at_once")
    assert unrolled["scan_unroll"] == 4 and unrolled["remat_parallel"]
    assert unrolled["ops_per_token"] < one["ops_per_token"]
    assert unrolled["peak_bytes_per_device"] == pytest.approx(
        one["peak_bytes_per_device"], rel=0.01
    )
    analytic = render._analytic(ROOT, "roofline_130m_at_once")
    bandwidth = step["copy_bandwidth_gb_per_s"] * 1e9
    floors = [us for _, us in roofline.floors(unrolled, analytic, bandwidth, 128)]
    total = sum(floors) + run["mfu_pct"] / 100 * 1e6 / run["tokens_per_s"]
    target = 1e6 / (0.7 * analytic["h100"])
    text = " ".join(
        open(os.path.join(ROOT, "docs", "performance.md"), encoding="utf-8").read().split()
    )
    assert (
        f"launches {unrolled['ops_per_token']:.1f} operations per token step instead of "
        f"{one['ops_per_token']:.1f}"
    ) in text
    assert f"add up to {total:.2f} µs per token against {target:.2f} µs at 70 %" in text


def test_what_the_step_moves_as_compiled_backs_the_page():
    """The by-kind table: its kinds add up to the loops, the loops move less than the whole
    step and the whole step more than the analytic count; and what the page says of it: by
    how much more, the elementwise operations most of the H100 run's excess, its bytes and
    launches against its measured step, and at once the bytes alone under 70 % of the bound,
    the bytes and launches together over it."""
    rows = {r["part"]: r for r in render.DERIVED["accel_h100_loops"](ROOT)["rows"]}
    kinds = [rows[k] for k in ("weight products", "memory passes", "per-step stores",
                               "elementwise and reductions")]  # fmt: skip
    loops, whole = rows["the per-token loops"], rows["the whole step, every array"]
    analytic = rows["the roofline's analytic count"]
    more = {}
    for col in ("token_by_token", "at_once"):
        for unit in ("ops", "mb"):
            total = sum(r[f"{col}_{unit}"] for r in kinds)
            assert total == pytest.approx(loops[f"{col}_{unit}"], rel=1e-9)
        assert (
            analytic[f"{col}_mb"] < whole[f"{col}_mb"] and loops[f"{col}_mb"] < whole[f"{col}_mb"]
        )
        more[col] = whole[f"{col}_mb"] / analytic[f"{col}_mb"] - 1
    excess = whole["token_by_token_mb"] - analytic["token_by_token_mb"]
    assert rows["elementwise and reductions"]["token_by_token_mb"] > excess / 2
    us = {r["part"].split(" (")[0]: r for r in rows.values()}
    bytes_us = us["the whole step's bytes at the run's copy bandwidth"]
    launches = us["the loops' launches, operations × 4 µs / B"]
    measured = us["measured step"]["token_by_token_mb"]
    ratio = (bytes_us["token_by_token_mb"] + launches["token_by_token_mb"]) / measured
    target = us["70 % of the data-sheet bound for the analytic bytes"]["at_once_mb"]
    assert bytes_us["at_once_mb"] < target < bytes_us["at_once_mb"] + launches["at_once_mb"]
    flat = " ".join(
        open(os.path.join(ROOT, "docs", "performance.md"), encoding="utf-8").read().split()
    )
    assert f"the H100 run's {100 * more['token_by_token']:.0f} % more" in flat
    assert f"rerun at once {100 * more['at_once']:.0f} % more" in flat
    assert f"add up to {ratio:.2f} times its measured step" in flat
    assert "come under 70 % of the data-sheet bound, but not with the loops' launches added" in flat


def test_the_tpu_compiles_rerun_at_once_back_what_the_page_says():
    """Per chip: at once, less of the memory matrix moved and a higher peak than token by
    token; on v5e the memory in VMEM through the per-token loops."""
    rows = render.load_collection(ROOT, "aot_130m_at_once")["rows"]
    by = {(r["topology"], r["rerun"]): r for r in rows}
    for chip in ("v5e:2x2", "v6e:1x1"):
        seq, once = by[chip, "token by token"], by[chip, "at once"]
        assert once["traffic_mb"] < seq["traffic_mb"] and once["peak_gib"] > seq["peak_gib"]
    assert by["v5e:2x2", "at once"]["vmem_word"] == "yes"
    text = open(os.path.join(ROOT, "docs", "performance.md"), encoding="utf-8").read()
    assert "At once, each chip's step moves less of the memory matrix for a higher peak" in text


def test_no_committed_compile_moves_less_than_its_minimum_traffic():
    """The minimum follows where the compiled step holds the memory: a compile below it would
    mean one of the two counts is wrong (as XLA:TPU's VMEM-resident rows once read 0.44×)."""
    for name in ("aot_130m", "aot_130m_pallas", "aot_130m_at_once", "aot_130m_gpu"):
        for r in render.load_collection(ROOT, name)["rows"]:
            ratio = r["traffic_ratio"]
            assert ratio is None or ratio >= 1, (name, r["topology"], r["batch_per_device"])


def test_the_h100_runs_backward_padded_w0_inside_its_loop():
    """What the page says of the H100 run's own optimised HLO: a per-token loop body pads W0^T
    (27,358 rows, to a multiple of its split-K product's split) at every step, a 137 MB copy,
    which the backward now does once outside the loop (`core.fused.layout.transposed`)."""
    from gpn_jax.benchmarks import roofline, traffic
    from gpn_jax.io import regular
    from gpn_jax.parallel import hlo

    path = os.path.join(ROOT, render.RESULTS, "accel_h100", "train_step.hlo.txt.gz")
    text = regular.read_gzip(path, 64 * 2**20).decode()
    comps, _ = hlo.parse(text)
    bodies = {loop["body"] for loop in roofline.loop_ops(text, 2048)["loops"]}
    size = lambda i: sum(b for _, b in traffic.arrays(i.result, 1))  # noqa: E731
    pads = [
        i for b in bodies for i in comps[b]
        if i.opcode == "fusion" and "pad" in i.name and size(i) > 2**27
    ]  # fmt: skip
    assert pads and all(i.result.startswith("bf16[27392,2496]") for i in pads)
    assert round(size(pads[0]) / 1e6) == 137
    page = open(os.path.join(ROOT, "docs", "performance.md"), encoding="utf-8").read()
    assert "137 MB copy per token step" in page
    # read and written once per token step of B = 128 sequences (the by-kind table's text)
    assert f"pad of W0^T alone about {2 * size(pads[0]) / 128 / 1e6:.1f} MB per token" in " ".join(
        page.split()
    )
    # read and written once per step of B = 128 sequences, at the run's copy bandwidth
    step = render.load(ROOT, "accel_h100_step")
    us = 2 * size(pads[0]) / 128 / (step["copy_bandwidth_gb_per_s"] * 1e9) * 1e6
    unaccounted = render.DERIVED["accel_h100_time"](ROOT)["rows"][-2]["us_per_token"]
    assert f"that copy alone is {us:.2f} µs per token of the {unaccounted:.2f} µs" in page.replace(
        "\n", " "
    )
