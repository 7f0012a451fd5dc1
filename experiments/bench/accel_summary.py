"""The result files of one accelerator run (`experiments/bench/accel_bench.py`'s folder), for
`tools/render_results.py`:

    python experiments/bench/accel_bench.py --summarise=DIR --out=experiments/results/NAME

writes NAME_step.json (one row per training-step record: the GPN+M step per kernels x memory
dtype x batch, then Transformer++ and Gated DeltaNet) and NAME_check.json (one row per Pallas
pass and storage against the XLA formulas on the device, and one for the 5 training steps).
A record that failed, timed out or was not reached is a row that says so, never a number.

The folder came back from another machine: each file is read as data (JSON objects of at most
16 MiB, the size a lent machine returns) and a missing or malformed one is a one-line error.
"""

import datetime
import json
import os
import re

from gpn_jax.io import files, regular, untrusted
from gpn_jax.models import factory

MAX_BYTES = 16 * 2**20
MODELS = {k: f"{factory.label(k)} 130M" for k in ("gpn_m", "transformer", "gdn")}
_TIMEOUT = re.compile(r"timed out after (\d+) seconds")
TOKEN_BY_TOKEN = "token by token"  # a GPN+M record without `rerun` (`accel_plan.Record`)


def _read(folder: str, name: str) -> dict:
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        raise ValueError(f"{path}: missing; pass the folder an accel_bench.py run wrote")
    if os.path.getsize(path) > MAX_BYTES:
        raise ValueError(f"{path}: larger than 16 MiB; not an accel_bench.py part file")
    data = untrusted.read_json(path, fix="rerun the part that writes it", max_bytes=MAX_BYTES)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object; rerun the part that writes it")
    return data


def _outcome(record: dict) -> str:
    if "skipped" in record:
        why = record["skipped"]
        return "not run: the part's budget was spent" if why == "out of time" else f"not run: {why}"
    error = record.get("error")
    if error is None:
        return "ok"
    timed_out = _TIMEOUT.search(str(error))
    if timed_out:
        return f"timed out (the {timed_out.group(1)} s left in the part)"
    return str(error)[:120]


def _step_row(record: dict, family: str) -> dict:
    ok = _outcome(record) == "ok"
    peak = record.get("peak_mem_bytes")
    return {
        "model": MODELS.get(family, family),
        "kernels": record.get("kernels", "—"),
        "memory_dtype": record.get("memory_dtype", "—"),
        # GPN+M's remat segments: rerun token by token unless the record says otherwise
        "rerun": record.get("rerun", TOKEN_BY_TOKEN) if family == "gpn_m" else "—",
        # its per-token loops unrolled (`accel_plan.UNROLLED`) or as CUDA graphs
        # (`accel_plan.GRAPHS`), else one token per iteration and XLA's defaults
        "unroll": record.get("unroll", "—"),
        "graphs": record.get("graphs", "—"),
        "loops": ", ".join(record[k] for k in ("unroll", "graphs") if record.get(k, "-") != "-")
        or "—",
        "batch_size": record.get("batch_size"),
        "seq_len": record.get("seq_len"),
        "tokens_per_s": record.get("tokens_per_s") if ok else None,
        "step_time_s": record.get("step_time_s") if ok else None,
        "mfu_pct": 100 * record["mfu"] if ok and record.get("mfu") is not None else None,
        "peak_mem_gib": peak / 2**30 if ok and peak else None,
        "ops_per_token": record.get("ops_per_token") if ok else None,
        "compile_s": record.get("compile_s") if ok else None,
        "outcome": _outcome(record),
    }


def _part_status(folder: str, part: str, status) -> str:
    """The part's status, "cut off" where its file lacks the `finished` time every part writes
    last (a run before the fix of `accel.run_part` recorded a part killed at its deadline as
    "ok")."""
    path = os.path.join(folder, f"{part}.json")
    if status == "ok" and os.path.isfile(path) and "finished" not in _read(folder, f"{part}.json"):
        return "cut off at its deadline"
    return str(status)


def summarise(folder: str, out_stem: str = "OUT") -> tuple[dict, dict]:
    """(step result, check result) of the run in `folder`, as result-file objects."""
    versions = _read(folder, "versions.json")
    step, baselines, check = (_read(folder, f"{p}.json") for p in ("step", "baselines", "check"))
    for name, part in (("step.json", step), ("baselines.json", baselines)):
        records = part.get("records")
        if not isinstance(records, list) or not records:
            raise ValueError(f"{os.path.join(folder, name)}: no records; rerun that part")
        if not all(isinstance(r, dict) for r in records):
            raise ValueError(f"{os.path.join(folder, name)}: a record is not an object")
    for r in step["records"] + baselines["records"]:
        r.setdefault("seq_len", step.get("seq_len"))
    rows = [_step_row(r, "gpn_m") for r in step["records"]]
    rows += [_step_row(r, r.get("family", "?")) for r in baselines["records"]]
    passes = _read(folder, "passes.json") if os.path.exists(f"{folder}/passes.json") else {}
    common = _common(folder, out_stem, versions)
    step_result = common | {
        "seq_len": step.get("seq_len"),
        "copy_bandwidth_gb_per_s": passes.get("copy_bandwidth_gb_per_s"),
        "rows": rows,
    }
    if os.path.exists(f"{folder}/hlo.json"):
        step_result["compiled"] = _compiled(folder, _read(folder, "hlo.json"), step.get("seq_len"))
    checks = _check_rows(check)
    if not checks:
        raise ValueError(f"{os.path.join(folder, 'check.json')}: no checks; rerun that part")
    return step_result, common | {"dims": check.get("dims"), "rows": checks}


def _compiled(folder: str, hlo: dict, seq_len) -> dict | None:
    """What the run's Pallas bfloat16 GPN+M step moves and launches as compiled
    (`aot.readout.program_fields`), from the `hlo` part's file, or read off the HLO it saved
    (`hlo_file`, or that name gzipped) where a run before these fields did not record them.
    None where neither is there."""
    from experiments.configs import gpn_m_1l_130m
    from gpn_jax.benchmarks import traffic
    from gpn_jax.benchmarks.aot import readout

    keep = ("batch_size", "memory_dtype", "ops_per_token", "bytes_per_token_hlo",
            "memory_bytes_per_token_hlo")  # fmt: skip
    if "memory_bytes_per_token_hlo" in hlo:
        return {k: hlo.get(k) for k in keep} | {"per_token_loop_kinds": hlo["per_token_loop_kinds"]}
    name, batch = hlo.get("hlo_file"), hlo.get("batch_size")
    if not isinstance(name, str) or not isinstance(batch, int) or not isinstance(seq_len, int):
        return None
    path = untrusted.inside(folder, name, source=f"{folder}/hlo.json", field="hlo_file")
    if os.path.isfile(path):
        text = regular.read_text(path, MAX_BYTES)
    elif os.path.isfile(path + ".gz"):
        try:
            text = regular.read_gzip(path + ".gz", MAX_BYTES).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(
                f"{path}.gz: not UTF-8 HLO text ({e.reason}); rerun the hlo part"
            ) from e
    else:
        return None
    cells = traffic.memory_cells(gpn_m_1l_130m.get_config().model)
    fields = readout.program_fields(text, seq_len, batch, batch * cells)
    return {k: hlo.get(k) for k in keep[:2]} | {
        k: fields[k] for k in (*keep[2:], "per_token_loop_kinds")
    }


def _common(folder: str, out_stem: str, versions: dict) -> dict:
    """The fields both result files share: commands, date, machine, versions, part statuses."""
    packages = versions.get("packages") or {}
    started = versions.get("started")
    date = "?"
    if isinstance(started, int | float):
        date = datetime.datetime.fromtimestamp(started, datetime.UTC).date().isoformat()
    device = versions.get("mode") == "device"
    return {
        "command": f"python experiments/bench/accel_bench.py --summarise={folder} --out={out_stem}",
        "run_command": "bash experiments/bench/h200_run.sh (accel_bench.py --device)"
        if device
        else "accel_bench.py --rehearse",
        "date": date,
        "machine": f"{versions.get('device_kind', '?')} ({versions.get('platform', '?')})",
        "version": ", ".join(
            f"{p} {packages.get(p)}" for p in ("jax", "jax-cuda13-plugin", "flax", "gpn_jax")
        ),
        "source": folder,
        "parts": {
            p: _part_status(folder, p, r.get("status"))
            for p, r in (versions.get("parts") or {}).items()
            if isinstance(r, dict)
        },
    }


def _check_rows(check: dict) -> list[dict]:
    """One row per pass and storage checked, then one for the training steps."""
    rows = [
        {
            "what": f"{r.get('pass')} pass, {r.get('memory_dtype')} memory",
            "ok": "yes" if r.get("ok") else "NO",
            "rel_err": r.get("rel_err"),
            "bound": r.get("bound"),
        }
        for r in check.get("passes") or []
        if isinstance(r, dict)
    ]
    train = check.get("train")
    if isinstance(train, dict):
        rel = train.get("rel_diff") or [None]
        rows.append(
            {
                "what": f"{len(rel)} training steps, pallas against xla (loss)",
                "ok": "yes" if train.get("ok") else "NO",
                "rel_err": max(rel) if None not in rel else None,
                "bound": train.get("bound"),
            }
        )
    return rows


def write(folder: str, out_stem: str) -> list[str]:
    """Writes OUT_STEM_step.json and OUT_STEM_check.json; their paths."""
    paths = []
    for suffix, data in zip(("step", "check"), summarise(folder, out_stem), strict=True):
        path = f"{out_stem}_{suffix}.json"
        files.atomic_write(path, (json.dumps(data, indent=1) + "\n").encode())
        paths.append(path)
    return paths
