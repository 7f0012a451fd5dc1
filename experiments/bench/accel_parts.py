"""The parts of the prepared accelerator run, one per process:

    python -m experiments.bench.accel_parts PART SETTINGS.json OUT.json [SCRATCH]

(`experiments.bench.accel` starts each with a timeout; SETTINGS from
`experiments/bench/bench_accel.settings`). Each part rewrites OUT.json (atomically) after every
row it finishes, so a part cut off by its timeout keeps what it measured. On a CPU the Pallas
kernels run in Pallas's interpreter (the rehearsal); elsewhere compiled for the device.

  versions   the platform, device and package versions; on a GPU whether cuDNN's fused
             attention runs
  check      (a) each Pallas pass against the XLA formulas on this device, float32 and bfloat16
             storage (`kernels.selfcheck.compare_passes`, its bounds); 5 training steps of a
             small GPN+M with kernels=pallas against kernels=xla (float32, `highest` matmul
             precision so that XLA's formulas are float32 too): the losses agree within
             f32 eps x T x d_value x 4 (only the memory's contractions differ, rounded in
             another order; x4 for what the optimiser carries into the next step)
  passes     (b) µs per token of each pass, XLA against Pallas, and the GB/s of the pass's
             minimum bytes against a copy bandwidth measured in the same process
  step       (c) the GPN+M training step per (kernels, memory dtype, batch) record (the
             batch sweep, then float32 memory), each in its own worker process: tokens/s, MFU against the matmul peak measured by the worker,
             peak device memory, operations per token of the per-token loops (compiled HLO)
  baselines  (d) GPN+M, Transformer++ (cuDNN's attention, checked first: `versions` records
             whether it runs) and Gated DeltaNet at the same batch and window
  hlo        (e) the optimised HLO of the comparison's Pallas step, its per-token loop
             operations, and a profile of one step (`benchmarks.op_profile`)
"""

import json
import os
import platform as pyplatform
import sys
import time

from experiments.bench.accel_plan import SWITCHES
from gpn_jax.io import files, provenance, untrusted
from gpn_jax.io.regular import MAX_TEXT_BYTES, read_text

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before any JAX client

MAX_HLO_BYTES = 15 * 2**20  # under the 16 MiB a result file may have
_RERUN = "start the accelerator run again (`experiments.bench.accel` writes it)"
# A 130M record on an H100 took about 50 s (a fresh process, a 20 s compile, a warm-up and
# three steps: experiments/results/accel_h100/step.json)
RECORD_FLOOR_S = 75


class Out:
    """A JSON object saved atomically (temporary file, rename) after every change."""

    def __init__(self, path: str, **fields):
        self.path, self.data = path, dict(fields)
        self.save()

    def add(self, key: str, row) -> None:
        self.data.setdefault(key, []).append(row)
        self.save()

    def set(self, **fields) -> None:
        self.data.update(fields)
        self.save()

    def save(self) -> None:
        files.atomic_write(self.path, json.dumps(self.data, indent=1, default=str).encode())


def _error(e: BaseException) -> str:
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text if len(text) <= 400 else text[:200] + " ... " + text[-190:]


def _kernels():
    """The Pallas passes for this process's device (interpreted on a CPU)."""
    import jax

    from gpn_jax.kernels.pallas import memory_kernels

    platform = jax.default_backend()
    return memory_kernels(interpret=platform == "cpu", platform=platform)


# ----------------------------------------------------------------------------- versions
def versions(settings: dict, out: Out, scratch: str) -> None:
    import jax

    pkgs = ("jax", "jaxlib", "jax-cuda13-plugin", "flax", "optax", "orbax-checkpoint", "numpy")
    pkgs += ("ml_collections", "chex", "absl-py", "sentencepiece", "gpn_jax")
    found = {p: provenance.installed_version(p) for p in pkgs}
    d = jax.devices()[0]
    out.set(
        python=pyplatform.python_version(),
        packages=found,
        platform=d.platform,
        device_kind=getattr(d, "device_kind", d.platform),
        device_count=jax.device_count(),
        memory_stats=d.memory_stats() if d.platform != "cpu" else None,
        preallocate=os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
        compile_cache=os.environ.get("JAX_COMPILATION_CACHE_DIR"),
    )
    if d.platform == "gpu":  # checked before any record that needs it
        out.set(cudnn_attention=cudnn_attention())
    print(f"versions: {json.dumps(out.data)}", flush=True)


# ----------------------------------------------------------------------------- (a) check
def check(settings: dict, out: Out, scratch: str) -> None:
    import jax

    from gpn_jax.kernels import selfcheck

    dims = tuple(settings["check_dims"])
    device, passes = jax.devices()[0], _kernels()
    out.set(dims=dims, bounds="kernels.selfcheck module docstring")
    for dtype in ("float32", "bfloat16"):
        results = selfcheck.compare_passes(passes, device, dtype, dims)
        for name, r in results.items():
            out.add("passes", {"memory_dtype": dtype, "pass": name} | r)
            print(f"check {dtype} {name}: {'ok' if r['ok'] else 'FAILED'} {r}", flush=True)
    jax.config.update("jax_default_matmul_precision", "highest")
    out.set(train=train_check(settings["train_check"]))


def train_check(tc: dict) -> dict:
    """5 steps with kernels=xla and =pallas from the same state and tokens: the losses."""
    from gpn_jax.benchmarks import train

    losses = {}
    for choice in ("xla", "pallas"):
        spec = {"compute_dtype": "float32", "batch_size": tc["batch_size"]}
        spec |= {"seq_len": tc["seq_len"]}
        one = train.compiled_step(spec, tc["model"] | {"kernels": choice})[0]
        losses[choice] = [float(one()) for _ in range(tc["steps"])]
    bound = 2.0**-23 * tc["seq_len"] * tc["model"]["d_value"] * 4  # module docstring
    rel = [abs(p - x) / abs(x) for p, x in zip(losses["pallas"], losses["xla"], strict=True)]
    result = {"losses": losses, "rel_diff": rel, "bound": bound, "ok": max(rel) <= bound}
    print(f"check train: {result}", flush=True)
    return result


# ----------------------------------------------------------------------------- (b) passes
def passes(settings: dict, out: Out, scratch: str) -> None:
    from experiments.bench import accel
    from gpn_jax.benchmarks import measure
    from gpn_jax.kernels.pallas import bench

    B, H, K, U, S = settings["pass_dims"]
    copy_bw = measure.memory_bandwidth(settings.get("copy_mib", 0))
    out.set(dims=[B, H, K, U, S], copy_bandwidth_gb_per_s=copy_bw / 1e9)
    for dtype in ("float32", "bfloat16"):
        try:
            timed = bench.time_passes(B, H, K, U, dtype, S=S, reps=settings["pass_reps"])
        except Exception as e:  # noqa: BLE001 - one failed storage must not lose the other
            out.add("rows", {"memory_dtype": dtype, "error": _error(e)})
            continue
        for name, r in timed.items():
            for backend in ("xla", "pallas"):
                out.add("rows", accel.pass_row(dtype, name, backend, r, copy_bw))
        print(f"passes {dtype}: {timed}", flush=True)


# ----------------------------------------------------------------------------- (c), (d)
def _spec(settings: dict, name: str, model: dict, batch: int, timeout: float, hlo: str) -> dict:
    return {
        "suite": "train",
        "name": name,
        "config": f"accel_{settings['mode']}",
        "model": model,
        "batch_size": batch,
        "seq_len": settings["seq_len"],
        "warmup": 1,
        "steps": 3,
        "compute_dtype": "auto",
        "peak_size": settings["peak_size"],
        "peak_reps": 2,
        "profile_dir": "",
        "timeout_s": max(1, int(timeout)),
        "hlo_path": hlo,
    }


def _record(spec: dict, isolate: bool) -> dict:
    """One training record (its worker process), with MFU against the worker's peak."""
    from gpn_jax.benchmarks import orchestrate

    try:
        result = orchestrate.run_spec(spec, isolate)
    except Exception as e:  # noqa: BLE001 - a failed record (OOM, timeout) is a result
        return {"error": _error(e)}
    r = result["records"][0]  # with its per-token loop ops (`train.run`)
    peak = max(result["peak_flops"])
    return r | {"peak_flops": peak, "mfu": r["achieved_flops"] / peak}


def _records(settings, out: Out, scratch: str, jobs, prefix: str) -> None:
    """jobs: (name, model block, batch, labels, estimated seconds or None, XLA flags or None:
    the worker's `XLA_FLAGS` beside the run's); each record within
    the part's time left (the parent's deadline, passed as GPN_JAX_ACCEL_DEADLINE seconds
    since the epoch); a job with a "skip" label is recorded as skipped."""
    deadline = float(os.environ.get("GPN_JAX_ACCEL_DEADLINE", time.time() + 3600))
    isolate = settings["mode"] != "rehearse"
    for i, (name, model, batch, labels, estimate, xla_flags) in enumerate(jobs):
        left = deadline - time.time() - 2
        if labels.get("skipped") or left < 10:
            out.add("records", {"skipped": "out of time"} | labels | {"batch_size": batch})
            continue
        # a record that hangs leaves the next ones their share (at least RECORD_FLOOR_S each);
        # one with the plan's estimate gets twice that
        share = 2 * estimate if estimate else left / (len(jobs) - i)
        timeout = min(left, max(share, RECORD_FLOOR_S))
        hlo = os.path.join(scratch, f"{prefix}_{name}_{i}.hlo.txt")
        spec = _spec(settings, name, model, batch, timeout, hlo) | {"xla_flags": xla_flags}
        # the record's own labels last: its `family` is the plan's (gpn_m), not the model
        # block's (GPN+M's block says gpn)
        row = {"batch_size": batch} | _record(spec, isolate) | labels
        row["hlo_file"] = hlo if os.path.exists(hlo) else None
        out.add("records", row)
        keys = ("tokens_per_s", "mfu", "peak_mem_bytes", "ops_per_token", "error")
        print(f"{name} {labels}: { ({k: row.get(k) for k in keys}) }", flush=True)


def _jobs(settings: dict, records: list[dict], cudnn: str | None = None) -> list:
    """The records' jobs: each family's model block with the record's model fields (kernels,
    memory dtype, attention, remat_parallel) and XLA flags (CUDA graphs); a record of cuDNN's attention is skipped with
    `cudnn` when that failed."""
    jobs = []
    for r in records:
        labels = {"family": r["family"]}
        labels |= {k: r[k] for k in SWITCHES if r.get(k, "-") != "-"}
        model = settings["models"][r["family"]] | r["model_fields"]
        if r["attention"] == "cudnn" and cudnn not in (None, "ok"):
            labels["skipped"] = f"cuDNN attention failed at the start: {cudnn}"
        jobs.append((r["family"], model, r["batch"], labels, r.get("seconds"), r.get("xla_flags")))
    return jobs


def step(settings: dict, out: Out, scratch: str) -> None:
    out.set(seq_len=settings["seq_len"])
    _records(settings, out, scratch, _jobs(settings, settings["step_records"]), "step")


def baselines(settings: dict, out: Out, scratch: str) -> None:
    """GPN+M, Transformer++ and Gated DeltaNet at the same tokens per step."""
    B = settings["batch_size"]
    out.set(seq_len=settings["seq_len"], tokens_per_step=B * settings["seq_len"])
    records = settings["baseline_records"]
    cudnn = None
    if any(r["attention"] == "cudnn" for r in records):
        versions = os.path.join(os.path.dirname(out.path), "versions.json")
        if os.path.isfile(versions):  # our own part's file: data only
            cudnn = untrusted.read_json(versions, fix=_RERUN).get("cudnn_attention")
        cudnn = cudnn or cudnn_attention()
    _records(settings, out, scratch, _jobs(settings, records, cudnn), "baselines")


def cudnn_attention() -> str:
    """ "ok" when cuDNN's fused causal attention compiles and runs here (bfloat16, a small
    window), else what failed (one line): the run's Transformer++ record needs it."""
    import jax
    import jax.numpy as jnp

    if jax.default_backend() != "gpu":
        return f"no GPU ({jax.default_backend()})"
    try:
        q = jnp.ones((1, 128, 2, 64), jnp.bfloat16)
        jax.block_until_ready(
            jax.jit(
                lambda q: jax.nn.dot_product_attention(
                    q, q, q, is_causal=True, implementation="cudnn"
                )
            )(q)
        )
    except Exception as e:  # noqa: BLE001 - the failure is the result
        return _error(e)
    return "ok"


# ----------------------------------------------------------------------------- (e) hlo
def hlo(settings: dict, out: Out, scratch: str) -> None:
    """The optimised HLO of the Pallas bfloat16 step next to OUT (train_step.hlo.txt) with
    its per-token loop operations: the one the baselines part saved for its GPN+M record when
    there is one (at once), else compiled here (a compile-cache read on the device); then a profile of one step (compiled in this
    process, within this part's own budget: a cut-off loses nothing else)."""
    from gpn_jax.benchmarks import train

    gpn = settings["models"]["gpn_m"] | {"kernels": "pallas", "memory_dtype": "bfloat16"}
    spec = _spec(settings, "gpn_m", gpn, settings["batch_size"], 0, "") | {"steps": 1}
    saved = os.path.join(scratch, "baselines_gpn_m_0.hlo.txt")  # the comparison's GPN+M
    first = settings["baseline_records"][0]
    same = ("gpn_m", "pallas", "bfloat16", spec["batch_size"])
    if (
        os.path.exists(saved)
        and tuple(first[k] for k in ("family", "kernels", "memory_dtype", "batch")) == same
    ):
        _save_hlo(out, read_text(saved, MAX_TEXT_BYTES), settings, "the comparison's GPN+M record")
    one, _, _, _, compiled = train.compiled_step(spec, gpn)
    if "hlo_file" not in out.data:
        _save_hlo(out, compiled.as_text(), settings, "compiled by this part")
    one()  # warm
    profile_dir = os.path.join(scratch, "profile")
    try:
        spec |= {"profile_dir": profile_dir}
        train.time_steps(one, spec, compiled.as_text)
        out.set(profile_ops_md=read_text(os.path.join(profile_dir, "ops.md"))[:200_000])
    except Exception as e:  # noqa: BLE001 - the profile is the last, optional figure
        out.set(profile_error=_error(e))


def _save_hlo(out: Out, text: str, settings: dict, source: str) -> None:
    from gpn_jax.benchmarks import traffic
    from gpn_jax.benchmarks.aot import readout

    batch, cells = settings["batch_size"], traffic.memory_cells(settings["models"]["gpn_m"])
    dest = os.path.join(os.path.dirname(out.path), "train_step.hlo.txt")
    files.atomic_write(dest, text[:MAX_HLO_BYTES].encode())
    out.set(
        hlo_file=os.path.basename(dest),
        hlo_source=source,
        hlo_chars=len(text),
        truncated=len(text) > MAX_HLO_BYTES,
        memory_dtype="bfloat16",
        batch_size=batch,
        **readout.program_fields(text, settings["seq_len"], batch, batch * cells),
    )


PARTS = {
    "versions": versions,
    "check": check,
    "passes": passes,
    "step": step,
    "baselines": baselines,
    "hlo": hlo,
}


def main(argv: list[str]) -> None:
    part, settings_path, out_path = argv[1], argv[2], argv[3]
    scratch = argv[4] if len(argv) > 4 else os.path.dirname(out_path)
    settings = untrusted.read_json(settings_path, fix=_RERUN)  # written by `accel`: data only
    out = Out(out_path, part=part, mode=settings["mode"], started=time.time())
    PARTS[part](settings, out, scratch)
    out.set(finished=time.time())


if __name__ == "__main__":
    main(sys.argv)
