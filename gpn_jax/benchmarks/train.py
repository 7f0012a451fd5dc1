"""Training-step records: a model's jitted step (loss, gradients, clipped AdamW) timed (`run`),
or several models' steps in turn in one process (`run_alternating`).

Tokens are random (the cost of a step does not depend on them). The step is the trainer's
(`training.setup.build`) on a one-device mesh. FLOPs are the analytic
`model.flops_per_token(T)["train"]` (matmuls only, 3 x forward), so MFU is comparable
across families: achieved FLOP/s divided by the matmul peak measured in the same run.
"""

import dataclasses
import os
import time

import jax
import ml_collections

from gpn_jax.benchmarks import measure, op_profile, roofline, traffic
from gpn_jax.configs import recipe
from gpn_jax.io import files
from gpn_jax.models import accounting, factory
from gpn_jax.parallel import mesh as meshlib
from gpn_jax.training import setup
from gpn_jax.training.host_memory import steady_step_memory


def time_steps(one, spec: dict, hlo_text=None) -> tuple[list, tuple, float]:
    """(times of `spec['steps']` steps after the warm-up, peak memory, the loss of one more
    step); then one profiled step when `spec['profile_dir']` is set, summarised per operation
    (`write_profile_tables`) when `hlo_text` (a function returning the step's optimised HLO) is
    given."""
    for _ in range(spec.get("warmup", 1)):
        one()
    times = measure.time_calls(one, spec["steps"])
    mem = measure.peak_memory_bytes()
    loss = float(one())
    if spec.get("profile_dir"):
        os.makedirs(spec["profile_dir"], exist_ok=True)
        with jax.profiler.trace(spec["profile_dir"]):
            jax.block_until_ready(one())
        if hlo_text is not None:
            write_profile_tables(spec["profile_dir"], hlo_text())
    return times, mem, loss


def write_profile_tables(profile_dir: str, hlo_text: str) -> str:
    """Next to the trace: the step's optimised HLO (`train_step.hlo.txt`) and `ops.md`, its
    operations' self times per loop and the largest ones (`benchmarks.op_profile`).
    Returns the path of `ops.md`."""
    files.atomic_write(os.path.join(profile_dir, "train_step.hlo.txt"), hlo_text.encode())
    rows = op_profile.summarize(op_profile.trace_events(profile_dir), hlo_text)
    path = os.path.join(profile_dir, "ops.md")
    text = "## Per loop\n\n" + op_profile.loop_table(rows, hlo_text)
    text += "\n## Largest operations\n\n" + op_profile.table(rows)
    files.atomic_write(path, text.encode())
    return path


def byte_accounting(model, B: int, T: int) -> dict:
    """The record's roofline inputs: bytes per token as run, in bfloat16 compute (the
    accelerator rows of `--device_spec`), and what `memory_dtype=bfloat16` saves per token."""
    byt = accounting.bytes_per_token(model, B, T)
    if byt is None:
        return {}
    cfg = model.config
    with_ = lambda **kw: accounting.bytes_per_token(
        type(model)(dataclasses.replace(cfg, **kw)), B, T
    )
    out = {"bytes_per_token": byt, "bytes_per_token_bf16": with_(compute_dtype="bfloat16")}
    if getattr(cfg, "memory", False) and hasattr(cfg, "memory_dtype"):
        saved = with_(memory_dtype="float32")["train"] - with_(memory_dtype="bfloat16")["train"]
        out["memory_bf16_saves"] = saved
    return out


def compiled_step(spec: dict, model_cfg: dict) -> tuple:
    """(one: a function running one training step and returning its loss, the model, compile
    seconds, RSS before building, the compiled step) for `model_cfg` at the spec's batch,
    window and dtype. The heap around steps as the trainer's (`training.host_memory`; spec
    `reuse_step_memory`, default True: freed buffers kept for the next step). Spec
    `compiler_options` (optional): XLA options for this compilation only."""
    dtype = measure.resolve_dtype(spec["compute_dtype"])
    B, T = spec["batch_size"], spec["seq_len"]
    overrides = dict(spec.get("overrides") or {})
    if "max_seq_len" in factory.config_fields(model_cfg):  # a window as long as the bench's
        overrides.setdefault("max_seq_len", T)
    model = measure.build_model(model_cfg, dtype, **overrides)
    rss0 = measure.host_rss_bytes()

    config = recipe.base_config()
    config.train.update(batch_size=B, seq_len=T, grad_accum=1)
    # The trainer's own step (`setup.build`) on a one-device mesh.
    one_device = ml_collections.ConfigDict({"data": 1, "fsdp": 1, "tensor": 1})
    built = setup.build(config, meshlib.make_mesh(one_device, jax.devices()[:1]), model=model)
    with jax.set_mesh(built.mesh):
        state = built.init_state(jax.random.PRNGKey(0))
        tokens = jax.device_put(
            jax.random.randint(jax.random.PRNGKey(1), (B, T), 0, model.config.vocab_size),
            built.batch_target().sharding,
        )
        t0 = time.perf_counter()
        options = spec.get("compiler_options") or None  # XLA debug options, e.g. window_ab
        compiled = built.train_step.lower(state, tokens).compile(compiler_options=options)
        compile_s = time.perf_counter() - t0
    steady_step_memory(spec.get("reuse_step_memory", True))
    holder = {"state": state}

    def one():
        holder["state"], metrics = compiled(holder["state"], tokens)
        return metrics["loss"]

    return one, model, compile_s, rss0, compiled


def _throughput(spec: dict, model, times: list) -> dict:
    """Step time (median), tokens/s and achieved FLOP/s of `times` (seconds per step)."""
    B, T = spec["batch_size"], spec["seq_len"]
    flops_tok = model.flops_per_token(T)["train"]
    step_s = measure.median(times)
    return {
        "step_time_s": step_s,
        "step_time_min_s": min(times),
        "step_times_s": times,
        "tokens_per_s": B * T / step_s,
        "flops_per_token": flops_tok,
        "achieved_flops": flops_tok * B * T / step_s,
    }


def run(spec: dict) -> dict:
    """spec: name, config, model (config block), batch_size, seq_len, steps, warmup,
    compute_dtype, overrides (model fields, e.g. remat_segment), profile_dir ('' for none)."""
    one, model, compile_s, rss0, compiled = compiled_step(spec, spec["model"])
    if spec.get("hlo_path"):  # the optimised HLO, for a caller to read (the accelerator run)
        files.atomic_write(spec["hlo_path"], compiled.as_text().encode())
    B, T = spec["batch_size"], spec["seq_len"]
    times, (mem, mem_kind), loss = time_steps(one, spec, compiled.as_text)
    return (
        {
            "model": spec["name"],
            "config": spec["config"],
            "suite": spec.get("suite", "train"),
            "family": factory.family_name(spec["model"]),
            "scan_impl": getattr(model.config, "scan_impl", None),
            "params": accounting.param_counts(model)["total"],
            "batch_size": B,
            "seq_len": T,
            "remat_segment": getattr(model.config, "remat_segment", None),
            "compute_dtype": measure.resolve_dtype(spec["compute_dtype"]),
            "compile_s": compile_s,
            "peak_mem_bytes": mem,
            "peak_mem_kind": mem_kind,
            "baseline_rss_bytes": rss0,
            "loss": loss,
        }
        | _throughput(spec, model, times)
        | byte_accounting(model, B, T)
        | traffic.step_fields(model.config, compiled.as_text(), B, T)
        | _loop_op_fields(compiled.as_text(), T)
    )


def _loop_op_fields(hlo_text: str, T: int) -> dict:
    """Operations per token of the step's per-token loops (the roofline's latency term)."""
    ops = roofline.loop_ops(hlo_text, T)
    return {k: ops[k] for k in ("ops_per_token", "forward_ops_per_token", "backward_ops_per_token")}


def rotated(names: list, r: int) -> list:
    """`names` started at position r (mod its length): round r's order in `run_alternating`."""
    k = r % len(names)
    return names[k:] + names[:k]


def run_alternating(spec: dict) -> list[dict]:
    """Training steps of several models side by side in time, in this one process.

    spec: models {name: config block}, reference (one of them), batch_size, seq_len, warmup,
    rounds, compute_dtype, config. Every model is compiled and warmed up; then each round
    runs one step of every model, the order rotated by one each round. Step times of one
    round lie seconds apart, so a shared machine's drift over minutes (its matmul peak can
    move by a quarter within minutes) slows every model alike, which
    it does not across the `train` suite's one-process-per-model records run minutes apart. `vs_reference` is
    the median over rounds of (reference step time / this model's step time) in the same
    round. Peak memory is the process's, shared by all models: not reported per model.
    """
    names = list(spec["models"])
    ref = spec["reference"]
    if ref not in names:
        raise ValueError(f"reference {ref!r} is not among the alternated models {names}")
    steps, models = {}, {}
    for name in names:
        steps[name], models[name], *_ = compiled_step(spec, spec["models"][name])
        for _ in range(spec.get("warmup", 1)):
            jax.block_until_ready(steps[name]())
    times = {name: [] for name in names}
    for r in range(spec["rounds"]):
        for name in rotated(names, r):
            times[name] += measure.time_calls(steps[name], 1)
    B, T = spec["batch_size"], spec["seq_len"]
    return [
        {
            "model": name,
            "config": spec["config"],
            "suite": "alternate",
            "family": factory.family_name(spec["models"][name]),
            "params": accounting.param_counts(models[name])["total"],
            "batch_size": B,
            "seq_len": T,
            "compute_dtype": measure.resolve_dtype(spec["compute_dtype"]),
            "reference": ref,
            "rounds": spec["rounds"],
            "vs_reference": measure.median(
                [a / b for a, b in zip(times[ref], times[name], strict=True)]
            ),
            "peak_mem_bytes": None,
        }
        | _throughput(spec, models[name], times[name])
        for name in names
    ]
