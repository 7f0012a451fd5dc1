"""Ahead-of-time check: compile a config's train step for an N-device mesh on forced CPU
devices, from abstract inputs, and report per-device memory."""

import json
import math
import os
import subprocess
import sys

import jax
import pytest

from experiments.configs import gpn_m_tiny, transformer_tiny
from gpn_jax.benchmarks.aot import gpus, plan, readout, search, step, targets, tpus
from tests.environment import FAST_COMPILE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cli_env() -> dict:
    """No platform and no forced devices: the CLI must choose the CPU and its device count."""
    return {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"} | {
        "XLA_FLAGS": FAST_COMPILE
    }


def test_parse_mesh():
    cfg = {"data": -1, "fsdp": 1, "tensor": 1}
    assert targets.parse_mesh("2,4,1", cfg) == {"data": 2, "fsdp": 4, "tensor": 1}
    assert targets.parse_mesh("fsdp=4,tensor=2", cfg) == {"data": -1, "fsdp": 4, "tensor": 2}
    assert targets.parse_mesh(None, cfg) == cfg
    with pytest.raises(ValueError, match="unknown mesh axis"):
        targets.parse_mesh("model=2", cfg)
    with pytest.raises(ValueError, match="needs 3 sizes"):
        targets.parse_mesh("2,4", cfg)


def test_compile_reports_sharded_state_and_memory():
    config = gpn_m_tiny.get_config()
    config.train.update(dict(batch_size=8, seq_len=16))
    result = step.compile_train_step(config, jax.devices()[:8], {"data": 2, "fsdp": 4, "tensor": 1})
    report = step.memory_report(result, memory_bytes=targets.GiB)
    # the train state (params, Adam mu and nu, float32) is split 4 ways over fsdp, except
    # the vectors, which stay whole
    leaves = jax.tree.leaves(result["abstract"])
    full = sum(math.prod(a.shape) * a.dtype.itemsize for a in leaves)
    assert full / 4 < report["state"] < full / 2
    assert report["arguments"] >= report["state"]
    assert report["aliased"] == report["state"]  # the state is donated
    assert report["temporaries"] > 0 and report["fits"]
    assert report["total"] == (
        report["arguments"] + report["outputs"] - report["aliased"] + report["temporaries"]
    )
    assert report["loop_collectives"] == {}
    text = readout.format_report(config, result, report, targets.GiB)
    assert "per-device memory" in text and "fits in 1 GiB" in text


@pytest.mark.slow
def test_cli_forces_cpu_devices_and_prints_memory():
    env = cli_env()
    proc = subprocess.run(
        [
            sys.executable, "-m", "gpn_jax.aot",
            "--config=experiments/configs/gpn_m_tiny.py", "--devices=4", "--mesh=fsdp=2",
            "--config.train.batch_size=4", "--config.train.seq_len=8", "--memory_gb=0.001",
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "mesh {'data': 2, 'fsdp': 2, 'tensor': 1} on 4 cpu devices" in out
    assert "temporaries" in out and "does NOT fit in 0.001 GiB" in out
    assert "no collective inside any loop body" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--mesh=3,1,1"],
            "gpn-aot: error: mesh {'data': 3, 'fsdp': 1, 'tensor': 1} needs 3 devices, have 4",
        ),
        (
            ["--mesh=1,1,4"],  # the default scan_impl is fused: whole heads per device
            "gpn-aot: error: scan_impl='fused' splits whole memory heads and d_ffn over the "
            "tensor axis: n_heads=2 and d_ffn=128 must be divisible by its size 4",
        ),
        (
            ["--config.model.d_modle=8"],
            "gpn-aot: error: unknown config field or bad value in --config.model.d_modle=8",
        ),
    ],
    ids=["mesh", "fused_tensor", "unknown_field"],
)
def test_cli_reports_bad_input_in_one_line(args, message):
    """Also shows the CLI forces the asked-for number of CPU devices (4 here)."""
    env = cli_env()
    proc = subprocess.run(
        [
            sys.executable, "-m", "gpn_jax.aot", "--config=experiments/configs/gpn_m_tiny.py",
            "--devices=4", *args,
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.startswith(message) and proc.stderr.count("\n") == 1, proc.stderr


def tiny_config():
    config = gpn_m_tiny.get_config()
    config.train.update(dict(batch_size=4, seq_len=16))
    return config


def check_record(record: dict) -> None:
    assert isinstance(record["fits"], bool)
    assert isinstance(record["peak_bytes_per_device"], int) and record["peak_bytes_per_device"] > 0
    assert record["kernels"] in ("xla", "native", "pallas")
    assert record["unknown_trip_counts"] == []
    cells = 2 * 16 * 32  # gpn_m_tiny: H x K x U
    # float32 storage, no remat: 4 x 4 + 8 with the memory in HBM (`traffic` module doc)
    floor = {(False, False): 24, (True, False): 8, (True, True): 0}
    on_chip = (record["memory_on_chip"], record["stack_on_chip"])
    assert record["memory_bytes_per_token_min"] == cells * floor[on_chip]
    assert isinstance(record["memory_bytes_per_token_hlo"], float)
    # the minimum is a floor: for where the step holds the memory, never above what it moves
    assert record["memory_bytes_per_token_hlo"] >= record["memory_bytes_per_token_min"]
    json.dumps(record)  # plain JSON types


def _scan_hlo(n_matmuls: int, outer: int = 1, inner: int = 16) -> str:
    """A compiled scan (nested in an `outer` one when outer > 1) whose body chains
    `n_matmuls` products x <- tanh(x @ W)."""
    import jax.numpy as jnp

    def body(x, w):
        for _ in range(n_matmuls):
            x = jnp.tanh(x @ w)
        return x, None

    def f(x, w):
        run = lambda x, _: jax.lax.scan(lambda c, _: body(c, w), x, None, length=inner)
        return jax.lax.scan(run, x, None, length=outer)[0] if outer > 1 else run(x, None)[0]

    x, w = jnp.ones((4, 8)), jnp.eye(8) * 0.5
    return jax.jit(f).lower(x, w).compile().as_text()


def test_loop_ops_counts_the_operations_of_the_per_token_bodies():
    """Each extra product in the body is a fixed number of extra operations per run; the body
    runs its trip count times its enclosing loop's, and per token is over the window."""
    from gpn_jax.benchmarks import roofline

    one, three = (roofline.loop_ops(_scan_hlo(n), 16) for n in (1, 3))
    (a,), (b,) = one["loops"], three["loops"]
    assert a["runs"] == b["runs"] == 16 and a["direction"] == "forward"
    per_product = (b["ops"] - a["ops"]) / 2
    assert per_product >= 1 and per_product == int(per_product)
    assert one["ops_per_token"] == a["ops"] and one["backward_ops_per_token"] == 0
    nested = roofline.loop_ops(_scan_hlo(1, outer=4, inner=8), 32)
    (inner,) = nested["loops"]  # the outer body runs a loop: not a per-token body
    assert inner["runs"] == 32 and nested["ops_per_token"] == inner["ops"]


KINDS_HLO = """HloModule m

%gemm_fusion_w (x: bf16[4,8], w: bf16[8,8]) -> f32[4,8] {
  %x = bf16[4,8]{1,0} parameter(0)
  %w = bf16[8,8]{1,0} parameter(1)
  ROOT %d = f32[4,8]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%conv_w (x: bf16[4,8], w: bf16[8,8]) -> f32[4,8] {
  %x = bf16[4,8]{1,0} parameter(0)
  %w = bf16[8,8]{1,0} parameter(1)
  ROOT %c = f32[4,8]{1,0} convolution(%x, %w), dim_labels=bf_io->bf
}

%cast (y: f32[4,8]) -> bf16[4,8] {
  %y = f32[4,8]{1,0} parameter(0)
  ROOT %c = bf16[4,8]{1,0} convert(%y)
}

%store (s: f32[16,4,8], y: f32[4,8], i: s32[]) -> f32[16,4,8] {
  %s = f32[16,4,8]{2,1,0} parameter(0)
  %y = f32[4,8]{1,0} parameter(1)
  %i = s32[] parameter(2)
  %z = s32[] constant(0)
  %u = f32[1,4,8]{2,1,0} bitcast(%y)
  ROOT %w = f32[16,4,8]{2,1,0} dynamic-update-slice(%s, %u, %i, %z, %z)
}

%body (t: (s32[], bf16[4,8], bf16[8,8], f32[16,4,8])) -> (s32[], bf16[4,8], bf16[8,8], f32[16,4,8]) {
  %t = (s32[], bf16[4,8]{1,0}, bf16[8,8]{1,0}, f32[16,4,8]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = bf16[4,8]{1,0} get-tuple-element(%t), index=1
  %w = bf16[8,8]{1,0} get-tuple-element(%t), index=2
  %st = f32[16,4,8]{2,1,0} get-tuple-element(%t), index=3
  %y = f32[4,8]{1,0} fusion(%x, %w), kind=kCustom, calls=%gemm_fusion_w
  %y2 = f32[4,8]{1,0} fusion(%x, %w), kind=kOutput, calls=%conv_w
  %k = f32[4,8]{1,0} custom-call(%y), custom_call_target="__gpu$xla.gpu.triton"
  %c = bf16[4,8]{1,0} fusion(%k), kind=kLoop, calls=%cast
  %s2 = f32[16,4,8]{2,1,0} fusion(%st, %k, %i), kind=kLoop, calls=%store
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  ROOT %r = (s32[], bf16[4,8]{1,0}, bf16[8,8]{1,0}, f32[16,4,8]{2,1,0}) tuple(%j, %c, %w, %s2)
}

%cond (t: (s32[], bf16[4,8], bf16[8,8], f32[16,4,8])) -> pred[] {
  %t = (s32[], bf16[4,8]{1,0}, bf16[8,8]{1,0}, f32[16,4,8]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %n = s32[] constant(16)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (x: bf16[4,8], w: bf16[8,8], st: f32[16,4,8]) -> f32[16,4,8] {
  %x = bf16[4,8]{1,0} parameter(0)
  %w = bf16[8,8]{1,0} parameter(1)
  %st = f32[16,4,8]{2,1,0} parameter(2)
  %z = s32[] constant(0)
  %t = (s32[], bf16[4,8]{1,0}, bf16[8,8]{1,0}, f32[16,4,8]{2,1,0}) tuple(%z, %x, %w, %st)
  %o = (s32[], bf16[4,8]{1,0}, bf16[8,8]{1,0}, f32[16,4,8]{2,1,0}) while(%t), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"16"}}
  ROOT %s = f32[16,4,8]{2,1,0} get-tuple-element(%o), index=3
}
"""


def test_loop_kinds_sorts_a_step_s_operations_and_what_they_move():
    """One token step of 4 sequences: two products by a weight (XLA:GPU's matmul fusion and
    XLA:TPU's convolution fusion: each reads x and W, writes y), a kernel, an elementwise cast
    and an in-place store of a step's value: per token step that many operations of each
    kind, and per token each one's bytes over the 4 sequences."""
    from gpn_jax.benchmarks import roofline

    kinds = roofline.loop_kinds(KINDS_HLO, 16, 4, 0)
    ops = {k: v["ops"] for k, v in kinds.items()}
    assert ops == dict(zip(roofline.KINDS, (2.0, 1.0, 1.0, 1.0), strict=True))
    moved = {k: v["bytes_per_token"] * 4 for k, v in kinds.items()}  # per token step
    x, w, y = 4 * 8 * 2, 8 * 8 * 2, 4 * 8 * 4
    assert moved == {
        "weight products": 2 * (x + w + y),
        "memory passes": 2 * y,
        "per-step stores": y + 4 + y,  # reads the step's value and index, writes one slice
        "elementwise and reductions": y + x,
    }


def test_the_latency_floor_binds_when_ops_outlast_the_bytes():
    from gpn_jax.benchmarks import roofline

    plain = roofline.bound(1e6, 1e6, 1e12, 1e12)
    assert plain == (1e6, "compute")
    assert roofline.bound(1e6, 1e6, 1e12, 1e12, 80 / 16, 4e-6) == (1 / (80 / 16 * 4e-6), "latency")
    assert roofline.bound(1e6, 1e6, 1e12, 1e12, 80 / 16, 0.0) == plain


def test_cpu_record_has_traffic_fields():
    """XLA:CPU keeps every array in memory: the step moves at least the schedule's minimum."""
    config = tiny_config()
    result = step.compile_train_step(config, jax.devices()[:1], {"data": 1, "fsdp": 1, "tensor": 1})
    report = step.memory_report(result, targets.GiB)
    record = readout.step_record(config, result, report, targets.GiB)
    check_record(record)
    assert record["fits"] and record["batch_per_device"] == 4
    assert record["memory_bytes_per_token_hlo"] >= record["memory_bytes_per_token_min"]
    # the fused window's per-token loops: forward, and the backward's (custom vjp) loops
    assert record["forward_ops_per_token"] > 0 and record["backward_ops_per_token"] > 0
    assert record["ops_per_token"] == pytest.approx(
        record["forward_ops_per_token"] + record["backward_ops_per_token"]
    )


def test_tpu_topology_compile(tmp_path):
    """The tiny train step compiled for a v5e:2x2 slice with libtpu's compile-only devices;
    the process's environment is as before (processes it starts later get no TPU host's
    variables, with which libtpu would probe for a chip and print its failure)."""
    missing = tpus.libtpu_missing()
    if missing:
        pytest.skip(missing)
    environ = dict(os.environ)
    out = tmp_path / "aot.json"
    flags = dict(
        devices=None, topology="v5e:2x2", mesh="4,1,1", memory_gb=None, json=True,
        out=str(out), find_max_batch=False, max_trials=1,
    )  # fmt: skip
    record = plan.run(tiny_config(), flags, ["gpn-aot", "--topology=v5e:2x2"])
    check_record(record)
    assert record["platform"] == "tpu" and record["device_kind"] == "TPU v5 lite"
    assert record["devices"] == 4 and record["batch_per_device"] == 1
    assert record["fits"] and record["hbm_bytes_per_device"] == 16 * targets.GiB
    assert json.loads(out.read_text())["fits"] is True
    assert record["command"] == "python -m gpn_jax.aot --topology=v5e:2x2"
    assert dict(os.environ) == environ


def test_compile_only_executables_are_never_written_to_the_persistent_cache():
    """JAX cannot load a TPU topology's executable back from its cache on a CPU host (it warns
    on every later compile): such compiles write no entry; others keep the user's setting."""
    import jax

    before = jax.config.jax_persistent_cache_min_compile_time_secs
    with step._uncached(True):
        assert jax.config.jax_persistent_cache_min_compile_time_secs == float("inf")
    with step._uncached(False):
        assert jax.config.jax_persistent_cache_min_compile_time_secs == before
    assert jax.config.jax_persistent_cache_min_compile_time_secs == before


def test_bad_topology_is_one_line():
    with pytest.raises(ValueError, match="expected <v4|v5e|v5p|v6e>"):
        targets.topology_devices("v5e-8")


def test_batch_search_brackets_the_largest_fitting_batch():
    """`_next_batch` on a made-up step whose peak is 1 GiB + 0.5 GiB per sequence, in 16 GiB:
    30 fits and 31 does not, so the search ends with 24 fitting and 32 failing."""
    memory = 16 * targets.GiB

    def compile_at(b):
        peak = targets.GiB + b * targets.GiB // 2
        return {"batch_per_device": b, "peak_bytes_per_device": peak, "fits": peak <= memory}

    trials, batch = [], 8
    while batch is not None:
        trials.append(compile_at(batch))
        batch = search._next_batch(trials, memory, 8)
        assert len(trials) < 10
    fit = max(t["batch_per_device"] for t in trials if t["fits"])
    fail = min(t["batch_per_device"] for t in trials if not t["fits"])
    assert (fit, fail) == (24, 32) and len(trials) <= 4


def test_tpu_memory_in_vmem_moves_at_least_its_stack():
    """v5e holds a 2 MiB memory (8 x 8 x 128 x 256 float32) in VMEM through the per-token
    loops, but not the segment's stack of 16: the step moves more than the stack's write and
    read (2m per cell and token), and less than the HBM-resident minimum 5m + 8."""
    missing = tpus.libtpu_missing()
    if missing:
        pytest.skip(missing)
    config = gpn_m_tiny.get_config()
    config.train.update(dict(batch_size=8, seq_len=64))
    config.model.update(dict(n_heads=8, d_key=128, d_value=256, remat_segment=32))
    device = targets.topology_devices("v5e:1x1")[0]
    result = step.compile_train_step(config, [device], {"data": 1, "fsdp": 1, "tensor": 1})
    record = readout.step_record(config, result, step.memory_report(result), None)
    cells = 8 * 128 * 256
    assert (record["memory_on_chip"], record["stack_on_chip"]) == (True, False)
    assert record["memory_bytes_per_token_min"] == cells * 8
    assert cells * 8 <= record["memory_bytes_per_token_hlo"] < cells * 28


# ----------------------------------------------------------------------------- NVIDIA GPUs
def _gpu_flags(out, batches=(), topology="h100"):
    return dict(
        devices=None, topology=topology, mesh="1,1,1", memory_gb=None, json=True,
        out=str(out), find_max_batch=False, max_trials=1, batches=list(batches),
    )  # fmt: skip


def test_a_gpus_usable_memory_is_the_client_limit_the_h100_run_measured(monkeypatch):
    """The fit check compares a GPU step's peak with what JAX's client may allocate: on the
    H100 that is the limit its run reported (`bytes_limit`); XLA_PYTHON_CLIENT_MEM_FRACTION
    moves it as it moves the client's."""
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    path = os.path.join(ROOT, "experiments/results/accel_h100/versions.json")
    with open(path) as f:
        versions = json.load(f)
    h100 = type("Device", (), {"device_kind": versions["device_kind"]})()
    assert targets.hbm_bytes(h100) == versions["memory_stats"]["bytes_limit"]
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".9")
    assert targets.hbm_bytes(h100) == int(0.9 * gpus.GPUS["h100"].memory_bytes)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "lots")  # JAX's default, as JAX would
    assert targets.hbm_bytes(h100) == versions["memory_stats"]["bytes_limit"]


def test_gpu_names_and_a_missing_toolchain_are_one_line(monkeypatch):
    for bad in ("h100:x", "a100", "h100:2:2"):
        with pytest.raises(ValueError, match="h100, h200"):
            targets.topology_devices(bad)
    monkeypatch.setattr(gpus.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError) as e:
        targets.topology_devices("h100:2")
    assert 'pip install -e ".[gpu]"' in str(e.value) and "\n" not in str(e.value)


def test_batches_compile_one_trial_each(tmp_path):
    config = tiny_config()
    config.train.batch_size = 2
    flags = _gpu_flags(tmp_path / "aot.json", batches=(1, 2), topology=None) | {"devices": 1}
    record = plan.run(config, flags, ["gpn-aot", "--batches=1,2"])
    assert [t["batch_per_device"] for t in record["trials"]] == [1, 2]
    peaks = [t["peak_bytes_per_device"] for t in record["trials"]]
    assert peaks[0] < peaks[1]  # twice the sequences, more activations
    assert record["search_complete"] and record["largest_fitting_batch_per_device"] == 2
    assert json.loads((tmp_path / "aot.json").read_text())["trials"] == record["trials"]


@pytest.mark.slow
def test_gpu_compile_from_this_host(tmp_path):
    """The tiny GPN+M step with Pallas kernels and a tiny Transformer++ with cuDNN's attention
    compiled for an H100 (sm_90) on this CPU host: the GPU's kernels are in the program."""
    missing = gpus.toolchain_missing()
    if missing:
        pytest.skip(missing)
    config = tiny_config()
    config.model.update(kernels="pallas", compute_dtype="bfloat16")
    record = plan.run(config, _gpu_flags(tmp_path / "a.json"), ["gpn-aot"])
    check_record(record)
    assert record["platform"] == "gpu" and record["device_kind"] == "NVIDIA H100 80GB HBM3"
    assert record["kernels"] == "pallas" and record["fits"]
    assert record["hbm_bytes_per_device"] == gpus.GPUS["h100"].usable_bytes
    config = transformer_tiny.get_config()
    config.train.update(dict(batch_size=2, seq_len=16))
    config.model.update(attention="cudnn", compute_dtype="bfloat16")
    devices = targets.topology_devices("h200")
    result = step.compile_train_step(config, devices, {"data": 1, "fsdp": 1, "tensor": 1})
    assert "cudnn$fmha" in result["compiled"].as_text()


def test_the_committed_h100_compile_matches_what_the_h100_run_measured():
    """The GPN+M step (Pallas, bfloat16 memory, B = 128) compiled for an H100 on a CPU host:
    its peak is within 5 % of the one the H100 run measured, and its per-token loops launch
    fewer operations than the run's program (counted off the run's own compiled step;
    docs/performance.md says how many fewer, and why)."""
    results = os.path.join(ROOT, "experiments", "results")
    with open(os.path.join(results, "aot_130m_h100_gpn_m.json")) as f:
        compiled = next(t for t in json.load(f)["trials"] if t["batch_per_device"] == 128)
    with open(os.path.join(results, "accel_h100_step.json")) as f:
        run = next(
            r for r in json.load(f)["rows"]
            if (r["model"], r["kernels"], r["memory_dtype"], r["batch_size"])
            == ("GPN+M 130M", "pallas", "bfloat16", 128)
        )  # fmt: skip
    peak = compiled["peak_bytes_per_device"] / targets.GiB
    assert abs(peak / run["peak_mem_gib"] - 1) <= 0.05, (peak, run["peak_mem_gib"])
    assert compiled["ops_per_token"] < run["ops_per_token"]
    assert (compiled["kernels"], compiled["memory_dtype"]) == ("pallas", "bfloat16")
