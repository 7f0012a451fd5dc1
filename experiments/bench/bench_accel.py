"""What the prepared accelerator run measures (`experiments/bench/accel_bench.py`): the paper's 130M
GPN+M training step (`gpn_m_1l_130m.py`'s model, T = 2048, its remat segment of 64), Transformer++
and Gated DeltaNet at 130M at the same tokens per step, and the memory's passes at the 130M
shapes (15 heads x 128 x 256). `settings("device")` is the GPU run, `settings("rehearse")` the
same parts at toy sizes for a CPU (the Pallas kernels interpreted), `get_config()` the bench
config of the 130M step (`python -m gpn_jax.bench --config=experiments/bench/bench_accel.py`).

XLA:CPU's memory analysis of the 130M step (`python -m gpn_jax.aot --devices=1 --mesh=1,1,1`)
gives about 39 GiB per device at B = 128, which an 80 GB+ GPU holds.
"""

import math
import os

import ml_collections

from experiments.bench import accel_plan, bench_tiny
from experiments.configs import gdn_130m, gpn_m_1l_130m, transformer_130m
from gpn_jax.benchmarks import bench_config

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODES = ("device", "rehearse")
RESULTS = os.path.join(_ROOT, "experiments", "results")
# Seconds of each part; time a part leaves unused passes to the next ones. From the H100 run
# (experiments/results/accel_h100/): the check took 35 s. The device run's `baselines` and
# `step` budgets are its plan's estimates (`accel_plan`) with a fifth to spare.
DEVICE_BUDGETS = dict(smoke=45, check=40, passes=45, step=160, baselines=110, hlo=30)
SPARE = 1.2
# the compile cache of the device run, inside the checkout (git-ignored `runs/`): a lent
# machine keeps it between the calls of one session, so a rerun's compiles are cache reads
CACHE_DIR = os.path.join(_ROOT, "runs", "jax_cache")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, "", "tiny"):
        raise ValueError(f"unknown config variant {arg!r}; the only variant is ':tiny'")
    c = bench_config.base_config("bench_accel", "train")  # compute_dtype auto: bf16 on GPU/TPU
    c.models = ml_collections.ConfigDict({"gpn_m_130m": gpn_m_1l_130m.get_config().model})
    c.train.update(dict(models="gpn_m_130m", seq_len=2048, warmup=1, steps=3))
    c.train.batch_size = 128
    if arg == "tiny":
        tiny = bench_tiny.get_config()  # its toy GPN+M and matmul-peak sizes
        c.models = ml_collections.ConfigDict({"gpn_m_130m": tiny.models.gpn_m})
        c.peak = tiny.peak
        c.train.update(dict(seq_len=32, warmup=1, steps=1, batch_size=4))
    return c


def _small_gpn_m() -> dict:
    """The correctness check's model: bench_tiny's GPN+M with power-of-two K and U (Triton's
    blocks), float32 compute."""
    m = bench_tiny.get_config().models.gpn_m.to_dict()
    return m | dict(d_key=16, d_value=32, compute_dtype="float32")


def settings(mode: str, budgets=(), records=(), kind: str = "h100") -> dict:
    """Everything the parts need, as plain data (the part processes read it as JSON).
    `budgets`: "part=seconds" overrides of the budget shares; `records`: the step part's
    "kernels:memory_dtype:batch[:at_once][:unroll][:graphs]" records instead of the mode's
    (`accel_bench.py`'s flags);
    `kind`: the device the run's plan is for (`accel_plan.make`)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {MODES}")
    s = _settings(mode, kind)
    s["budgets"] |= dict(_budget(b) for b in budgets)
    if records:
        s["step_records"] = [gpn_record(**_step_record(r)) for r in records]
    return s


def gpn_record(
    kernels: str, memory_dtype: str, batch: int, seconds=None, rerun="-", unroll="-", graphs="-"
) -> dict:
    """A GPN+M step record as the settings hold it (`accel_plan.Record.settings`)."""
    rec = accel_plan.Record(
        "gpn_m", batch, kernels, memory_dtype, rerun=rerun, unroll=unroll, graphs=graphs
    )
    return rec.settings(seconds)


def plan(kind: str) -> dict:
    """The device run's plan for `kind` from the committed result files."""
    return accel_plan.make(kind, RESULTS)


def _budget(text: str) -> tuple[str, float]:
    part, _, sec = text.partition("=")
    try:
        seconds = float(sec)
    except ValueError:
        seconds = -1.0
    if part not in DEVICE_BUDGETS or not seconds > 0:
        raise ValueError(
            f"--budgets entry {text!r}: write PART=SECONDS, PART one of {', '.join(DEVICE_BUDGETS)}"
        )
    return part, seconds


# a step record's optional words after its batch: the record's switch and value
_STEP_WORDS = {
    "at_once": ("rerun", accel_plan.AT_ONCE),
    "unroll": ("unroll", accel_plan.UNROLLED),
    "graphs": ("graphs", accel_plan.GRAPHS),
}


def _step_record(text: str) -> dict:
    parts = text.split(":")
    (kernels, dtype, batch), words = (parts + ["", "", ""])[:3], parts[3:]
    if (
        kernels not in ("xla", "pallas")
        or dtype not in ("float32", "bfloat16")
        or not (batch.isdigit() and int(batch) > 0)
        or any(w not in _STEP_WORDS for w in words)
        or len(set(words)) < len(words)
    ):
        raise ValueError(
            f"--step_records entry {text!r}: write "
            "KERNELS:MEMORY_DTYPE:BATCH[:at_once][:unroll][:graphs], e.g. pallas:float32:128 "
            "or pallas:bfloat16:128:at_once:unroll:graphs (kernels xla or "
            "pallas, dtype float32 or bfloat16)"
        )
    switches = dict(_STEP_WORDS[w] for w in words)
    return {"kernels": kernels, "memory_dtype": dtype, "batch": int(batch)} | switches


def _settings(mode: str, kind: str) -> dict:
    if mode == "rehearse":
        tiny = bench_tiny.get_config().models
        models = {k: tiny[k].to_dict() for k in ("gpn_m", "transformer", "gdn")}
        models["gpn_m"]["remat_segment"] = 8  # remat segments, as the 130M model's
        batch, seq_len, peak_size, copy_mib = 2, 16, 256, 16
        check_dims, pass_dims, reps = (2, 2, 8, 16, 3), (2, 2, 8, 16, 4), 2
        # the three families at the same batch (their GPN+M record's HLO is the HLO part's),
        # then the kind of record the sweep ends with
        compare = [gpn_record("pallas", "bfloat16", batch)]
        compare += [accel_plan.Record(f, batch).settings() for f in ("transformer", "gdn")]
        records = [gpn_record("pallas", "bfloat16", batch, rerun=accel_plan.AT_ONCE)]
        records += [gpn_record("xla", "float32", batch)]
        budgets = {k: 300 for k in DEVICE_BUDGETS} | {"smoke": 0}
        train_check = {"model": _small_gpn_m(), "batch_size": 2, "seq_len": 16, "steps": 5}
        env = {"JAX_PLATFORMS": "cpu"}  # no accelerator plugin probes the machine
    else:
        models = {
            "gpn_m": gpn_m_1l_130m.get_config().model.to_dict(),
            "transformer": transformer_130m.get_config().model.to_dict(),
            "gdn": gdn_130m.get_config().model.to_dict(),
        }
        p = plan(kind)
        if p["compare_batch"] is None:
            raise ValueError(f"no batch at which the three 130M families fit {kind}: {p['rows']}")
        batch, seq_len, peak_size = p["compare_batch"], 2048, 0  # 0: an 8192 matmul off a CPU
        copy_mib = 0  # 0: the copy bandwidth over 2 GiB off a CPU
        check_dims, pass_dims, reps = (4, 15, 128, 256, 16), (128, 15, 128, 256, 16), 8
        compare = accel_plan.settings_records(p, "baselines")
        records = accel_plan.settings_records(p, "step")
        budgets = dict(DEVICE_BUDGETS)
        for part, recs in (("baselines", compare), ("step", records)):
            budgets[part] = math.ceil(SPARE * sum(r["seconds"] for r in recs))
        train_check = {"model": _small_gpn_m(), "batch_size": 4, "seq_len": 64, "steps": 5}
        env = {"JAX_COMPILATION_CACHE_DIR": CACHE_DIR}
    return {
        "mode": mode,
        "models": models,
        "batch_size": batch,
        "seq_len": seq_len,
        "peak_size": peak_size,
        "copy_mib": copy_mib,
        "check_dims": check_dims,
        "pass_dims": pass_dims,
        "pass_reps": reps,
        "train_check": train_check,
        "baseline_records": compare,
        "step_records": records,
        "budgets": budgets,
        "env": env,
    }
