"""The device run's plan, made here before a GPU is booked (`accel_bench.py --plan=h100`):
which training-step records it attempts and in what order, whether each fits the named
device's memory, and how long the run takes, the first time and again with the compile cache.

Order: GPN+M (Pallas, bfloat16 memory), Transformer++ (cuDNN attention) and Gated DeltaNet at
the same tokens per step, the largest batch of `BATCHES` at which all three fit; then GPN+M at
B = 128 with its remat segments rerun at once (`model.remat_parallel`) and `UNROLL` tokens per
iteration of its per-token loops (`model.scan_unroll`: fewer launches), the same with XLA
replaying each per-token loop as one CUDA graph (`GRAPHS_XLA_FLAGS`: whether the loops'
launches, not their bytes, hold the step below 70 % of its bound), the GPN+M batch sweep,
float32 memory at `FLOAT32_BATCH` against bfloat16's at the same batch, and last the step at
once with one token per iteration (what the unroll alone changes). A record measured before on the same kind of device
(`experiments/results/accel_<kind>_step.json`) is not measured again.

Memory per record, in this order of preference:
  - a peak from a compile of that step for the device (XLA's memory analysis of
    `python -m gpn_jax.aot --topology=<kind> --batches=...`: the result files
    `aot_130m_<kind>_<family>.json`, the other kind's where the kind has none) or from a run
    (`accel_<kind>_step.json`; H100 and H200 run the same sm_90 program);
  - the step-memory model: peak = fixed + per-sequence x batch, a line through the record's
    points at two batches or more; from one point at batch B0 the bound peak(B0) below B0 and
    peak(B0) x B / B0 above it (the fixed part is never negative); float32 memory storage at
    most doubles the bfloat16 step's bytes;
  - none: the record is skipped ("no memory estimate").
A device's usable memory is the JAX client's share of it (`benchmarks.aot.gpus`: 0.75 by default).

Time per record: process start + compile + (warm-up + 3 steps) x B x T / tokens per second,
from a measured run (the kind's own first; an H100's rate is a floor for an H200), else the
stated assumptions below.
"""

import dataclasses
import glob
import math
import os

from experiments.bench.accel_summary import MODELS, TOKEN_BY_TOKEN
from gpn_jax.benchmarks.aot import gpus
from gpn_jax.io import untrusted
from gpn_jax.models import factory

GiB = 2**30
BATCHES = (128, 64, 32, 16, 8)  # the comparison's candidates, largest first
SWEEP = (128, 64, 32)  # the GPN+M batch sweep
FLOAT32_BATCH = 32  # float32 memory beside the comparison's bfloat16 GPN+M at this batch
SEQ_LEN = 2048
STEPS = 4  # the warm-up and three timed steps of a record
START_S = 10.0  # a worker process's start and imports on the lent machine
COMPILE_S = 30.0  # a 130M step's compile where the kind's run has none (H100: 18 to 24 s)
CACHED_COMPILE_S = 3.0  # the same compile read back from the persistent cache (a rerun)
# tokens/s where no run on the kind measured the record: assumed, stated in the plan
ASSUMED_TOKENS_PER_S = 50_000.0
FLOAT32_RATE = 0.3  # float32 memory against bfloat16's rate (the H100 float32 record's ~69 s)
# the parts outside the step records, in seconds (the H100 run: check 35 s)
FIXED_PARTS = {"versions": 15.0, "check": 40.0, "passes": 45.0, "hlo": 30.0}
RUN_S = 430.0  # the run inside the 8 minutes (the install and the machine's start first)


# a record's switches beside its family and batch ("-": the family's default or none)
SWITCHES = ("kernels", "memory_dtype", "attention", "rerun", "unroll", "graphs")
GRAPHS = "CUDA graphs"
UNROLL = 4  # tokens per iteration of the per-token loops (`model.scan_unroll`) of its records
UNROLLED = f"{UNROLL} tokens per loop iteration"
# its compile against one token per iteration (the 130M step rerun at once at B = 128,
# `gpn_jax.aot --topology=h100` on an idle host: 35 s against 26 s)
UNROLLED_COMPILE = 1.4
# XLA's default command buffers (fusions, cuBLAS, custom calls such as the Pallas kernels,
# cuDNN) plus while loops and conditionals: a per-token loop replayed as one CUDA graph
# instead of its operations launched one by one from the host
GRAPHS_XLA_FLAGS = (
    "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"
)


@dataclasses.dataclass(frozen=True)
class Record:
    family: str  # gpn_m | transformer | gdn
    batch: int
    kernels: str = "-"  # GPN+M: pallas | xla
    memory_dtype: str = "-"  # GPN+M: bfloat16 | float32
    attention: str = "-"  # Transformer++: cudnn | xla
    rerun: str = "-"  # GPN+M: "at once" (`model.remat_parallel`); "-": token by token
    unroll: str = "-"  # GPN+M: `UNROLLED` (`model.scan_unroll`); "-": one token per iteration
    graphs: str = "-"  # GPN+M: `GRAPHS` (its worker's XLA_FLAGS: `GRAPHS_XLA_FLAGS`)

    def key(self) -> tuple:
        return (self.family, *(getattr(self, k) for k in SWITCHES))

    def label(self) -> str:
        extra = [getattr(self, k) for k in SWITCHES if getattr(self, k) != "-"]
        return f"{self.family} B={self.batch}" + (f" ({', '.join(extra)})" if extra else "")

    def model_fields(self) -> dict:
        """The model block's fields this record sets."""
        fields = {k: getattr(self, k) for k in SWITCHES[:3] if getattr(self, k) != "-"}
        fields |= {"remat_parallel": True} if self.rerun == AT_ONCE else {}
        return fields | ({"scan_unroll": UNROLL} if self.unroll == UNROLLED else {})

    def settings(self, seconds: float | None = None) -> dict:
        """The record as the run's settings hold it (plain data), with the XLA flags its
        worker process takes (None: the defaults)."""
        flags = GRAPHS_XLA_FLAGS if self.graphs == GRAPHS else None
        return dataclasses.asdict(self) | {
            "model_fields": self.model_fields(),
            "xla_flags": flags,
            "seconds": seconds,
        }


AT_ONCE = "rerun at once"


def load_points(results: str, kind: str) -> tuple[dict, dict, set]:
    """({record key: {batch: (peak bytes, source)}}, {record key: (tokens/s, compile s)}, the
    records measured) from the compiles for the GPU (the kind's own first) and its run, if any."""
    peaks, rates, measured = {}, {}, set()
    for other in sorted(gpus.GPUS, key=lambda k: k != kind):
        for family in MODELS:  # the family's compiles, e.g. aot_130m_h100_gpn_m_at_once.json
            for path in sorted(
                glob.glob(os.path.join(results, f"aot_130m_{other}_{family}*.json"))
            ):
                data = untrusted.read_json(path, fix="restore it from git or recompile it")
                for t in data.get("trials") or [data]:
                    rec = _record(_compiled(t, family))
                    peak = (t["peak_bytes_per_device"], f"{other} compile")
                    peaks.setdefault(rec.key(), {}).setdefault(rec.batch, peak)
    for other in sorted(gpus.GPUS, key=lambda k: k != kind):  # the kind's own run first
        path = os.path.join(results, f"accel_{other}_step.json")
        if not os.path.isfile(path):
            continue
        for row in untrusted.read_json(path, fix="rerun --summarise").get("rows", []):
            if row.get("tokens_per_s") is None:
                continue
            rec = _record(row | {"family": _family(row["model"])})
            source = f"measured on {other}"
            peaks.setdefault(rec.key(), {}).setdefault(
                rec.batch, (row["peak_mem_gib"] * GiB, source)
            )
            rate = (row["tokens_per_s"], row.get("compile_s") or COMPILE_S)
            rates.setdefault(rec.key(), rate)
            if other == kind:
                measured.add(rec)
    return peaks, rates, measured


def _family(model: str) -> str:
    return {v: k for k, v in MODELS.items()}.get(model, model)


def _compiled(trial: dict, family: str) -> dict:
    """A `gpn_jax.aot` trial as a plan row, with the switches its model's config takes (GPN+M's
    kernels and memory dtype, Transformer++'s attention)."""
    takes = factory.config_fields({"family": factory.VARIANTS[family][0].name})
    switches = {k: trial.get(k) for k in SWITCHES[:3] if k in takes}
    switches["rerun"] = AT_ONCE if trial.get("remat_parallel") else "-"
    switches["unroll"] = UNROLLED if trial.get("scan_unroll") == UNROLL else "-"
    return {"family": family, "batch_size": trial["batch_per_device"]} | switches


def _record(row: dict) -> Record:
    unset = (None, "", "-", "—", TOKEN_BY_TOKEN)  # the summary's words for a default
    fields = {k: row[k] for k in SWITCHES if row.get(k) not in unset}
    return Record(row["family"], int(row["batch_size"]), **fields)


def estimate(rec: Record, peaks: dict) -> tuple[float | None, str]:
    """(peak bytes, where the figure comes from) of `rec` (module docstring); (None, why).
    A record whose loops are CUDA graphs or unrolled takes the same step's figure without."""
    if plain := _loops_plain(rec, peaks):
        return estimate(plain, peaks)
    points = peaks.get(rec.key(), {})
    if rec.batch in points:
        return points[rec.batch]
    if len(points) >= 2:
        xs, ys = zip(*sorted((b, p) for b, (p, _) in points.items()), strict=True)
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
        slope /= sum((x - mx) ** 2 for x in xs)
        return my + slope * (rec.batch - mx), f"step-memory line through B = {list(xs)}"
    if len(points) == 1:
        ((b0, (p0, _)),) = points.items()
        return p0 * max(1.0, rec.batch / b0), f"step-memory bound from B = {b0}"
    if rec.memory_dtype == "float32":
        half, source = estimate(dataclasses.replace(rec, memory_dtype="bfloat16"), peaks)
        if half is not None:
            return 2 * half, f"twice bfloat16's ({source})"
    return None, "no memory estimate: compile it for the device first (gpn_jax.aot)"


def seconds(rec: Record, rates: dict, cached: bool = False) -> tuple[float, str]:
    """(estimated seconds of the record's worker, where its rate comes from); an unmeasured
    record whose loops are unrolled compiles `UNROLLED_COMPILE` times as long."""
    (tokens_per_s, compile_s), source = _rate(rec, rates)
    if cached:
        compile_s = CACHED_COMPILE_S
    elif rec.unroll != "-" and rec.key() not in rates:
        compile_s *= UNROLLED_COMPILE
    return START_S + compile_s + STEPS * rec.batch * SEQ_LEN / tokens_per_s, source


def _rate(rec: Record, rates: dict) -> tuple[tuple, str]:
    """((tokens/s, compile s), source) of `rec`: measured, else the same step's whose loops are
    neither CUDA graphs nor unrolled, float32 memory's from bfloat16's, the rerun at once's
    from token by token's, else assumed."""
    if plain := _loops_plain(rec, rates):
        return _rate(plain, rates)
    rate = rates.get(rec.key())
    source = "measured rate"
    if rate is None and rec.memory_dtype == "float32":
        bf16 = rates.get(dataclasses.replace(rec, memory_dtype="bfloat16").key())
        if bf16:
            rate, source = (bf16[0] * FLOAT32_RATE, bf16[1]), "assumed: 0.3 x bfloat16's"
    if rate is None and rec.rerun == AT_ONCE:  # expected faster: the rerun's rate bounds it
        rate = rates.get(dataclasses.replace(rec, rerun="-").key())
        source = "assumed: the token-by-token rerun's"
    if rate is None:
        rate, source = (ASSUMED_TOKENS_PER_S, COMPILE_S), "assumed rate"
    return rate, source


def _loops_plain(rec: Record, known: dict) -> Record | None:
    """`rec` with one of its loops' switches (CUDA graphs, the unroll) undone where `known`
    (peaks or rates) has nothing for it; None where it has, or the loops are the defaults."""
    for switch in ("graphs", "unroll"):
        if getattr(rec, switch) != "-" and not known.get(rec.key()):
            return dataclasses.replace(rec, **{switch: "-"})
    return None


def _fits(rec: Record, peaks: dict, usable: float) -> dict:
    peak, source = estimate(rec, peaks)
    row = {"record": rec, "peak_bytes": peak, "memory_source": source}
    row["fits"] = peak is not None and peak <= usable
    if peak is not None and not row["fits"]:
        row["skip"] = f"needs {peak / GiB:.1f} GiB, {usable / GiB:.1f} usable"
    elif peak is None:
        row["skip"] = source
    return row


def compare_batch(peaks: dict, usable: float) -> tuple[int | None, list[dict]]:
    """The largest batch of `BATCHES` at which the three families fit, and the rows of the
    larger batches that did not (each with its reason)."""
    tried = []
    for b in BATCHES:
        rows = [_fits(r, peaks, usable) for r in compare_records(b)]
        if all(r["fits"] for r in rows):
            return b, tried
        tried += [r for r in rows if not r["fits"]]
    return None, tried


def compare_records(batch: int) -> list[Record]:
    return [
        Record("gpn_m", batch, "pallas", "bfloat16"),
        Record("transformer", batch, attention="cudnn"),
        Record("gdn", batch),
    ]


def sweep_records(skip_batch: int | None) -> list[Record]:
    """GPN+M at 128 rerun at once with its loops unrolled, without and with them as CUDA
    graphs, the batch sweep (Pallas, bfloat16 memory), float32 memory at `FLOAT32_BATCH`, then
    the step at once without the unroll."""
    at_once = Record("gpn_m", 128, "pallas", "bfloat16", rerun=AT_ONCE, unroll=UNROLLED)
    sweep = [Record("gpn_m", b, "pallas", "bfloat16") for b in SWEEP if b != skip_batch]
    float32 = [Record("gpn_m", FLOAT32_BATCH, k, "float32") for k in ("pallas", "xla")]
    graphs, one_token = (dataclasses.replace(at_once, graphs=GRAPHS),
                         dataclasses.replace(at_once, unroll="-"))  # fmt: skip
    return [at_once, graphs, *sweep, *float32, one_token]


def make(kind: str, results: str) -> dict:
    """The plan for a device of `kind` (h100 | h200) from the result files in `results`."""
    if kind not in gpus.GPUS:
        raise ValueError(f"unknown device kind {kind!r}; choose from {', '.join(gpus.GPUS)}")
    usable = gpus.GPUS[kind].usable_bytes
    peaks, rates, measured = load_points(results, kind)
    batch, larger = compare_batch(peaks, usable)
    rows = [dict(r, part="baselines") for r in larger]
    planned = compare_records(batch) if batch else []
    for r in planned:
        rows.append(dict(_fits(r, peaks, usable), part="baselines"))
    for r in sweep_records(batch):
        row = dict(_fits(r, peaks, usable), part="step")
        if r in measured:
            row["skip"] = f"measured before (accel_{kind}_step.json)"
        rows.append(row)
    _schedule(rows, rates)
    return {"kind": kind, "usable_bytes": usable, "compare_batch": batch, "rows": rows}


def _schedule(rows: list[dict], rates: dict) -> None:
    """Seconds of each record that runs, in order, within `RUN_S` with the fixed parts; a
    record past it is skipped with the reason."""
    spent = sum(FIXED_PARTS.values())
    for row in rows:
        if row.get("skip"):
            continue
        row["seconds"], row["rate_source"] = seconds(row["record"], rates)
        row["rerun_seconds"] = seconds(row["record"], rates, cached=True)[0]
        if spent + row["seconds"] > RUN_S:
            row["skip"] = f"past the run's {RUN_S:.0f} s"
            continue
        spent += row["seconds"]


def totals(plan: dict) -> tuple[float, float]:
    """(seconds of the run, of a rerun of its records with the compile cache warm: the
    versions and the records, not the check, passes and HLO parts again)."""
    runs = [r for r in plan["rows"] if not r.get("skip")]
    run = sum(FIXED_PARTS.values()) + sum(r["seconds"] for r in runs)
    return run, FIXED_PARTS["versions"] + sum(r["rerun_seconds"] for r in runs)


def describe(plan: dict) -> str:
    """The plan as text: one line per record (part, fits, peak, seconds or why skipped)."""
    lines = [
        f"plan for {plan['kind']}: {plan['usable_bytes'] / GiB:.1f} GiB usable "
        f"({gpus.mem_fraction()} of {gpus.GPUS[plan['kind']].memory_bytes / GiB:.1f})"
        f"; same tokens per step at "
        f"B = {plan['compare_batch']} x T = {SEQ_LEN}"
    ]
    for r in plan["rows"]:
        peak = "?" if r["peak_bytes"] is None else f"{r['peak_bytes'] / GiB:.1f} GiB"
        what = f"skipped: {r['skip']}" if r.get("skip") else f"{r['seconds']:.0f} s"
        lines.append(
            f"  {r['part']:9s} {r['record'].label():38s} {peak:>9s} ({r['memory_source']}) {what}"
        )
    run, rerun = totals(plan)
    fixed = ", ".join(f"{k} {v:.0f} s" for k, v in FIXED_PARTS.items())
    lines.append(
        f"  estimate: {run:.0f} s ({math.ceil(run / 60)} min; fixed parts: {fixed}), "
        f"a rerun of the records with the compile cache {rerun:.0f} s"
    )
    return "\n".join(lines)


def settings_records(plan: dict, part: str) -> list[dict]:
    """The records of `part` as the run's settings hold them (plain data)."""
    rows = [r for r in plan["rows"] if r["part"] == part and not r.get("skip")]
    return [r["record"].settings(round(r["seconds"])) for r in rows]


def wheels(folder: str) -> list[str]:
    """The wheel files in `folder` (the ones the lent machine installs); a one-line error
    when there are none, before a device is booked for a run that would stop at its install."""
    found = (
        sorted(n for n in os.listdir(folder) if n.endswith(".whl")) if os.path.isdir(folder) else []
    )
    if not found:
        raise ValueError(
            f"{folder}: no wheel file; download them first (experiments/bench/README.md, step 1)"
        )
    return found
