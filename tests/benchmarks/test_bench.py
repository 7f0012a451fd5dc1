"""`python -m gpn_jax.bench`: records, JSON, tables, plot and profile on toy configs (no timing asserted)."""

import json
import os
import subprocess
import sys

import pytest

from experiments.bench import bench_tiny
from gpn_jax.benchmarks import measure, orchestrate, report, roofline
from gpn_jax.kernels.cpu import small_matmul

REQUIRED = ("model", "config", "tokens_per_s", "mfu", "peak_mem_bytes")


@pytest.fixture(scope="module")
def all_suites(tmp_path_factory):
    """Every suite of the toy config run once in process (train, scaling, generate; profiled):
    (its config, output folder and records)."""
    tmp_path = tmp_path_factory.mktemp("all_suites")
    config = bench_tiny.get_config()
    config.train.models = "gpn_m,gdn"
    config.scaling.update(dict(seq_lens=(8, 16), batch_size=1, batch_sizes=(1,), seq_len=8))
    config.generate.models = "gpn_m,transformer"
    config.generate.batch_sizes = (1, 4)
    config.generate.kv_cache_limit_gb = 60_000 / 2**30  # the batch-4 cache at 64 is over it
    out = tmp_path / "out" / "tiny.json"
    orchestrate.run(
        config,
        str(tmp_path),
        str(out),
        ["train", "scaling", "generate"],
        profile=True,
        isolate=False,
    )
    return config, tmp_path, json.loads(out.read_text())


@pytest.mark.slow
def test_all_suites_in_process(all_suites):
    config, tmp_path, records = all_suites
    assert all(k in r for r in records for k in REQUIRED)
    assert not [r for r in records if r.get("error")]
    train = [r for r in records if r["suite"] == "train"]
    assert [r["model"] for r in train] == ["gpn_m", "gdn"]
    for r in train:
        assert r["tokens_per_s"] > 0 and r["peak_mem_bytes"] > 0
        # MFU = achieved / the best matmul peak measured in this same run (bench.py), so a value
        # over 1 means a wrong FLOP count or peak, not a fast machine.
        assert r["mfu"] == r["achieved_flops"] / r["peak_flops"] and 0 < r["mfu"] <= 1
        assert r["step_time_s"] > 0 and len(r["step_times_s"]) == config.train.steps

    scaling = [r for r in records if r["suite"] == "scaling"]
    points = {(r["batch_size"], r["seq_len"], r["remat_segment"]) for r in scaling}
    assert points == {(1, 8, 0), (1, 8, 2), (1, 16, 0), (1, 16, 4)}
    assert (tmp_path / "bench_tiny_scaling.png").stat().st_size > 0

    gen = [r for r in records if r["suite"] == "generate"]
    assert len(gen) == 2 * 2 * 2
    skipped = [r for r in gen if r.get("skipped")]
    assert [(r["model"], r["batch_size"], r["context"]) for r in skipped] == [
        ("transformer", 4, 64)
    ]
    for r in gen:
        if not r.get("skipped"):
            assert r["latency_s"] > 0 and r["tokens_per_s"] > 0

    assert train[0]["bytes_per_token"]["memory"] > 0 and train[0]["memory_bandwidth"] > 0
    assert train[1]["bytes_per_token"]["mixer"] > 0  # the baselines have byte models too
    text = (tmp_path / "bench_tiny.md").read_text()
    assert "CPU vector extensions: " in text and "| gpn_m | " in text.split("## Roofline")[1]
    assert f"the fused window's per-token products: {small_matmul.status()}" in text
    assert "| GPN+M (fused) |" in text and "## Generation" in text and "not run: KV cache" in text
    assert any(files for _, _, files in os.walk(tmp_path / "profile" / "gpn_m"))
    ops = (tmp_path / "profile" / "gpn_m" / "ops.md").read_text()
    # the fused window's loops ran: some operation sits inside a while loop of known trips
    assert "## Per loop" in ops and "## Largest operations" in ops and " (x" in ops
    assert (tmp_path / "profile" / "gdn" / "train_step.hlo.txt").read_text().startswith("HloModule")


@pytest.mark.process  # the library runs the record in a worker process (`isolate=True`)
def test_one_record_in_its_own_process(tmp_path):
    config = bench_tiny.get_config()
    config.train.models = "gpn"
    (spec,) = orchestrate.build_specs(config, ["train"], str(tmp_path), profile=False)
    result = orchestrate.run_spec(spec, isolate=True)
    (record,) = result["records"]
    assert record["model"] == "gpn" and record["tokens_per_s"] > 0
    assert record["bytes_per_token"]["memory"] == 0 < record["bytes_per_token_bf16"]["train"]
    assert record["peak_mem_bytes"] >= record["baseline_rss_bytes"] > 0
    assert result["peak_flops"][0] > 0


@pytest.mark.slow
def test_bfloat16_training_records_match_float32_loss(all_suites, tmp_path):
    """The accelerator setting (`compute_dtype=bfloat16`, what 'auto' picks on GPU / TPU) runs
    the same command unchanged; here on CPU, where the loss of a random model stays within
    2 % of float32's (the state, memory and norms stay float32). The float32 records are the
    in-process run's (`all_suites`: the same toy train config, float32 on a CPU)."""
    f32 = [r for r in all_suites[2] if r["suite"] == "train"]
    config = bench_tiny.get_config()
    config.train.models = "gpn_m,gdn"
    config.compute_dtype = "bfloat16"
    bf16 = [
        orchestrate.run_spec(spec, isolate=False)["records"][0]
        for spec in orchestrate.build_specs(config, ["train"], str(tmp_path), profile=False)
    ]
    losses = {}
    for record, dtype in [(r, "float32") for r in f32] + [(r, "bfloat16") for r in bf16]:
        assert record["compute_dtype"] == dtype and record["tokens_per_s"] > 0
        assert record["ops_per_token"] > 0  # its per-token loops (the roofline's latency)
        losses[record["model"], dtype] = record["loss"]
        if record["model"] == "gpn_m":  # 2 x 8 x 8 memory cells, float32, no remat: 4 x 4 + 8
            assert record["memory_bytes_per_token_min"] == 2 * 8 * 8 * 24
            assert record["memory_bytes_per_token_hlo"] > 0
        else:  # Gated DeltaNet: no GPN+M memory
            assert record["memory_bytes_per_token_hlo"] is None
            assert record["memory_bytes_per_token_min"] is None
    assert sorted(losses) == [(m, d) for m in ("gdn", "gpn_m") for d in ("bfloat16", "float32")]
    for name in ("gpn_m", "gdn"):
        f32, bf16 = losses[name, "float32"], losses[name, "bfloat16"]
        assert bf16 != f32 and abs(bf16 - f32) < 0.02 * f32, (name, f32, bf16)


def test_specs_and_remat_segments():
    config = bench_tiny.get_config()
    specs = orchestrate.build_specs(config, ["scaling"], "/tmp/x", profile=False)
    assert {s["overrides"]["remat_segment"] for s in specs} == {0, 4, 8}
    assert [orchestrate.sqrt_segment(t) for t in (256, 512, 1024, 2048, 4096)] == [
        16,
        16,
        32,
        32,
        64,
    ]
    with pytest.raises(ValueError, match="unknown model"):
        config.train.models = "nope"
        orchestrate.build_specs(config, ["train"], "/tmp/x", profile=False)


def test_memory_slopes():
    rec = lambda T, mem: dict(
        suite="scaling",
        batch_size=8,
        seq_len=T,
        remat_segment=4,
        peak_mem_bytes=mem,
        baseline_rss_bytes=100,
    )
    slopes = report.memory_slopes([rec(256, 200), rec(512, 300), rec(1024, 500)], True, 8)
    assert [round(s, 3) for _, _, s in slopes] == [1.0, 1.0]


def run_bench_cli(workdir, *flags):
    """`python -m gpn_jax.bench` on the tiny config, from the repository root."""
    argv = ["--config=experiments/bench/bench_tiny.py", f"--workdir={workdir}", *flags]
    return subprocess.run(
        [sys.executable, "-m", "gpn_jax.bench", *argv],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )


def test_cli_unknown_suite_is_one_line(tmp_path):
    proc = run_bench_cli(tmp_path, "--suites=train,nope")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("gpn-bench: error: unknown suite")


def test_cpu_vector_extensions_from_cpuinfo():
    x86 = (
        "processor\t: 0\nflags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile\n"
    )
    assert (
        measure.cpu_vector_extensions(x86)
        == "sse4_2 avx avx2 fma avx512f avx512_bf16 amx_tile amx_bf16"
    )
    arm = "processor\t: 0\nFeatures\t: fp asimd asimdhp sve bf16 i8mm\n"
    assert measure.cpu_vector_extensions(arm) == "asimd asimdhp sve bf16 i8mm"
    assert measure.cpu_vector_extensions("model name : x\n").startswith("unknown (")
    assert measure.cpu_vector_extensions()  # this machine: some line, never an exception


def test_roofline_bound_and_device_specs():
    # 1e9 FLOPs at 1e12 FLOP/s = 1 ms; 1e6 bytes at 1e10 B/s = 0.1 ms: compute-bound, 1000 tokens/s
    assert roofline.bound(1e9, 1e6, 1e12, 1e10) == (1000.0, "compute")
    assert roofline.bound(1e6, 1e9, 1e12, 1e10) == (10.0, "memory")
    specs = roofline.parse_device_specs("h100, V5E")
    assert [s.name for s in specs] == ["H100 SXM", "TPU v5e"]
    assert specs[1].peak_flops == 197e12 and specs[1].bandwidth == 819e9
    assert roofline.parse_device_specs("") == []
    with pytest.raises(ValueError, match=r"unknown --device_spec \['a100'\]; choose from"):
        roofline.parse_device_specs("h200,a100")


def test_roofline_table_from_a_record():
    byt = {"weights": 3e6, "memory": 1e6, "train": 4e6}
    rec = dict(
        suite="train",
        model="gpn_m",
        flops_per_token=8e6,
        tokens_per_s=250.0,
        bytes_per_token=byt,
        bytes_per_token_bf16={"train": 2e6},
        memory_bf16_saves=5e5,
    )
    # this machine: 8e6 / 4e9 = 2 ms vs 4e6 / 1e9 = 4 ms -> memory-bound, 250 tokens/s, all of it
    specs = roofline.parse_device_specs("v5e")
    text = roofline.table([rec], 4e9, 1e9, specs)
    assert "| gpn_m | 8.0M | 3.81 MiB | 2.0 | this machine | 250 | memory | 1.00 |" in text
    # v5e: 8e6 / 197e12 s vs 2e6 / 819e9 s -> memory-bound at 409,500 tokens/s
    assert "| TPU v5e (data sheet, bf16) | 409,500 | memory | unmeasured |" in text
    # with 100 sequential operations per time step over 4 sequences: 25 per token at 1 µs each
    # on a TPU, 40,000 tokens/s, under the bytes' bound (`roofline.OP_LATENCY_S`)
    slow = roofline.table([rec | {"ops_per_token": 100, "batch_size": 4}], 4e9, 1e9, specs)
    assert "| TPU v5e (data sheet, bf16) | 40,000 | latency | unmeasured |" in slow
    (line,) = roofline.byte_lines([rec])
    assert line.endswith("memory_dtype=bfloat16 saves 488.3 KiB/token (12 %)")


def test_cli_unknown_device_spec_is_one_line(tmp_path):
    proc = run_bench_cli(tmp_path, "--device_spec=h100,b200")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "gpn-bench: error: unknown --device_spec ['b200']; choose from ['h100', 'h200', 'v5e', 'v5p']"
    )


def test_alternated_steps_give_per_round_ratios(tmp_path):
    config = bench_tiny.get_config()
    config.alternate.update(dict(models="gpn,transformer", reference="transformer", rounds=3))
    (spec,) = orchestrate.build_specs(config, ["alternate"], str(tmp_path), profile=False)
    assert list(spec["models"]) == ["gpn", "transformer"] and spec["rounds"] == 3
    records = orchestrate.run_spec(spec, isolate=False)["records"]
    assert [r["model"] for r in records] == ["gpn", "transformer"]
    gpn, ref = records
    for r in records:
        assert r["suite"] == "alternate" and len(r["step_times_s"]) == 3
        assert r["tokens_per_s"] == 2 * 32 / r["step_time_s"]
    ratios = [a / b for a, b in zip(ref["step_times_s"], gpn["step_times_s"], strict=True)]
    assert gpn["vs_reference"] == sorted(ratios)[1] and ref["vs_reference"] == 1.0
    gpn["mfu"] = ref["mfu"] = 0.5
    table = report.alternate_table(records)
    assert "| GPN | 2 x 32 | 3 |" in table and "vs Transformer++ (median of rounds)" in table


def test_alternation_rotates_the_order_each_round():
    from gpn_jax.benchmarks import train

    names = ["a", "b", "c"]
    assert [train.rotated(names, r) for r in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]


def test_alternate_reference_outside_the_models_is_an_error(tmp_path):
    config = bench_tiny.get_config()
    config.alternate.update(dict(models="gpn_m,gdn", reference="transformer"))
    with pytest.raises(ValueError, match="alternate.reference 'transformer' is not among"):
        orchestrate.build_specs(config, ["alternate"], str(tmp_path), profile=False)


def test_loop_costs_times_the_fused_windows_matrix_shapes():
    """`experiments/bench/loop_costs.py` times products of the fused W0 and W2o: their widths must be
    those `fused.window.fuse_params` builds for the bench's GPN+M."""
    import jax

    from experiments.bench import loop_costs
    from gpn_jax.benchmarks import bench_config
    from gpn_jax.core.fused import window as fused_window

    block = bench_config.models().gpn_m
    model = measure.build_model(block.to_dict(), "float32")
    # shapes only: traced, nothing initialised or computed
    fw = jax.eval_shape(lambda k: fused_window.fuse_params(model.init(k)), jax.random.PRNGKey(0))
    assert loop_costs.fused_widths(block) == (fw["W0"].shape[1], fw["W2o"][0].shape[0])


def test_window_ab_loads_each_revisions_window():
    """`experiments/bench/window_ab.py` compiles the bench step with the fused window of each git
    revision it is given: the window and every part of `core/fused/` (`core/fused_*` before), as a package of
    its own (so a revision's forward / backward are its own too), and a clear exit for a
    revision that does not exist."""
    import tempfile

    from experiments.bench import window_ab
    from gpn_jax.core.fused import forward as fused_forward
    from gpn_jax.core.fused import window as fused_window

    with tempfile.TemporaryDirectory() as tmp:
        mod = window_ab.load_window("worktree", tmp)
        assert mod is not fused_window and mod.__file__.startswith(tmp)
        assert mod.default_segment(512) == fused_window.default_segment(512)
        parts = {m.__name__.split(".")[0] for m in (mod, sys.modules[mod.window_fwd.__module__])}
        assert (
            parts == {mod.__name__.split(".")[0]} and mod.window_fwd is not fused_forward.window_fwd
        )
        committed = window_ab.load_window("HEAD", tmp)  # from `git show`, into tmp
        assert committed.__file__.startswith(tmp) and callable(committed.scan_window_fused)
        with pytest.raises(SystemExit, match="no gpn_jax/core/fused/window.py at revision 'nope'"):
            window_ab.load_window("nope", tmp)


def test_window_ab_builds_each_revisions_kernel(monkeypatch):
    """Each revision's own product kernel is built and registered under an FFI target of its
    own, whose products are the kernel's; a revision without one (or no such revision) has
    none."""
    import tempfile

    import jax.numpy as jnp
    import numpy as np

    from experiments.bench import window_ab

    if not small_matmul.available():
        pytest.skip("no C++ compiler for the kernel")
    with tempfile.TemporaryDirectory() as tmp:
        assert window_ab.revision_file("HEAD", "gpn_jax/kernels/cpu/none.cc", tmp) is None
        assert window_ab.load_kernel("nope", tmp) is None
        target, tile = window_ab.load_kernel("worktree", tmp)
        assert target != small_matmul.TARGET and tile == small_matmul.load()
        rng = np.random.default_rng(0)
        x = rng.standard_normal((7, 33), dtype=np.float32)
        w = rng.standard_normal((33, 2 * tile + 3), dtype=np.float32)
        monkeypatch.setattr(small_matmul, "TARGET", target)
        y = small_matmul.matmul(jnp.asarray(x), small_matmul.pack(jnp.asarray(w)))
        # float32 products of length 33 with |x w| ~ 6: 33 x eps x 6 ~ 2.4e-5; 1e-4 allows ~4x
        np.testing.assert_allclose(np.asarray(y), x.astype(np.float64) @ w, rtol=0, atol=1e-4)


def test_window_ab_xla_options_reach_the_compiler_and_bad_ones_are_one_line():
    """`--xla_options` gives each revision's step its own XLA options: here YNNPACK for dots
    only leaves fewer YNNPACK fusions in the compiled step than the default (which also gives
    it reductions); malformed lists (of `--model_overrides` too) and options XLA refuses end in
    one line."""
    import re

    from experiments.bench import window_ab
    from gpn_jax.benchmarks import train

    assert window_ab.per_revision("xla_options", "", 2) == [{}, {}]
    dots_only = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"}
    assert window_ab.per_revision("xla_options", json.dumps([{}, dots_only]), 2) == [{}, dots_only]
    for text, message in [
        ("[{}", "is not JSON"),
        ('[{}, "x"]', "a JSON list of objects"),
        ("[{}]", "1 objects for 2 revisions"),
    ]:
        with pytest.raises(SystemExit, match=message):
            window_ab.per_revision("xla_options", text, 2)
    with pytest.raises(SystemExit, match="--model_overrides has 1 objects for 2 revisions"):
        window_ab.per_revision("model_overrides", "[{}]", 2)

    cfg = bench_tiny.get_config().models.gpn_m.to_dict()
    spec = dict(compute_dtype="float32", batch_size=2, seq_len=8)
    fusions = []
    for options in ({}, dots_only):
        compiled = train.compiled_step(spec | dict(compiler_options=options), cfg)[4]
        fusions.append(len(re.findall(r'"kind":"__ynn_fusion"', compiled.as_text())))
    assert fusions[0] > fusions[1] > 0, fusions
    with pytest.raises(SystemExit, match=r"^window_ab: XLA refused .*no_such_option"):
        window_ab.compiled_steps(["worktree"], "gpn_m", [{"xla_cpu_no_such_option": True}], [{}])


def test_accel_bench_config_is_the_papers_130m_model_at_2048():
    from experiments.bench import bench_accel
    from experiments.configs import gpn_m_1l_130m

    c = bench_accel.get_config()
    assert c.models.gpn_m_130m == gpn_m_1l_130m.get_config().model
    assert (c.train.seq_len, c.train.batch_size, c.suites) == (2048, 128, "train")
    with pytest.raises(ValueError, match=r"unknown config variant 'cpu'; the only variant"):
        bench_accel.get_config("cpu")
