"""Renders the result files in experiments/results/ into the Markdown tables of the docs.

Every measured result is a JSON file `experiments/results/NAME.json`:

    {"command": str, "date": str, "machine": str, "version": str, "rows": [{...}, ...], ...}

plus `"provenance": "transcribed"` where the numbers were copied from a log by hand rather
than written by the command; the table's Data line then says so.

A page (README.md or docs/*.md) shows it as a table between two markers:

    <!-- results:NAME -->
    <!-- /results:NAME -->

    python tools/render_results.py           # rewrite every table from its data
    python tools/render_results.py --check   # exit 1 if any table differs from its data

The column layout of a known result set is in `COLUMNS` (header, format over the row's fields,
alignment); any other file's table has one column per key of its first row. The result files
are data only: each is checked for size and shape, and a bad one stops the script with one line
naming it and what to fix, before any page is written.
"""

import argparse
import datetime
import json
import os
import platform
import re
import string
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout's gpn_jax, installed or not
from gpn_jax.models import factory  # noqa: E402 - after the checkout is on the path

RESULTS = os.path.join("experiments", "results")
PAGES = ("README.md", "docs")
MAX_BYTES = 1 << 20  # a result file is a small table; anything larger is not one of ours
REQUIRED = ("command", "date", "machine", "version", "rows")
# how a file came to be: written by its command's --out (the default), or transcribed by hand
PROVENANCE = ("written", "transcribed")
_NAME = re.compile(r"^[a-z0-9_]+$")
_MARKER = re.compile(
    r"<!-- results:(?P<name>[^ ]+) -->\n(?P<body>.*?)<!-- /results:(?P=name) -->", re.DOTALL
)

_PPL = "{heldout_ppl_mean:.2f} ± {heldout_ppl_std:.2f}"
_COMPARE = [
    ("Model", "{model}", "l"),
    ("Params", "{params:,}", "r"),
    ("Layers", "{layers}", "r"),
    ("State dim", "{state_dim}", "r"),
    ("Memory cells / state size", "{cells}", "l"),
    ("Held-out PPL", _PPL, "r"),
    ("Train PPL", "{train_ppl_mean:.2f} ± {train_ppl_std:.2f}", "r"),
    ("Held-out / train − 1", "{gap_pct_mean:+.1f} % ± {gap_pct_std:.1f} %", "r"),
    ("Same, unigram", "{unigram_gap_pct:+.1f} %", "r"),
]
_PREPARE = [
    ("corpus", "{corpus_mb} MB", "l"),
    ("workers", "{workers}", "r"),
    ("tokens", "{tokens:,.0f}", "r"),
    ("tokens/s (whole command)", "{tokens_per_s:,.0f}", "r"),
    ("as `prepare` reports it", "{tokens_per_s_reported:,.0f}", "r"),
    (
        "peak RSS: prepare / with workers",
        "{peak_rss_main_mb:.0f} / {peak_rss_with_workers_mb:.0f} MB",
        "r",
    ),
]
# The synthetic suite's speed (DIR/<name>_bench.json): per family, its cells' wall time.
_SYNTHETIC_BENCH = [
    ("model", "{model}", "l"),
    ("cells", "{cells}", "r"),
    ("wall time, all cells", "{wall_s:,.0f} s", "r"),
    ("first cell (with the compile)", "{first_cell_s:,.0f} s", "r"),
]
# one column per compared model (`gpn_jax.models.factory`'s variants), under its label
_FAMILY_COLUMNS = [(v.label, f"{{{key}}}", "r") for key, (_, v) in factory.VARIANTS.items()]
# The synthetic suite (experiments.synthetic): per task, test accuracy mean ± sd over seeds at
# the learning rate chosen on validation (in parentheses), one column per family.
_SYNTHETIC = [
    ("Task", "{task}", "l"),
    ("T", "{seq_len}", "r"),
    ("Vocab", "{vocab}", "r"),
    ("Train", "{n_train:,}", "r"),
    ("Setting", "{setting}", "l"),
    ("Chance", "{chance}", "r"),
    *_FAMILY_COLUMNS,
]
# The decisive suite's verdict tables, each a key of experiments/results/synthetic_decisive.json:
# every cell against its level without the ability (✓: cleared by the seeds' margin), the
# step learning started, and the published claims beside ours.
_SYNTHETIC_LEVELS = [
    ("Task", "{task}", "l"),
    ("Measured on", "{measured}", "l"),
    ("Chance", "{chance}", "r"),
    ("Level without the ability", "{level}", "r"),
    *_FAMILY_COLUMNS,
]
_SYNTHETIC_ONSETS = [("Task", "{task}", "l"), ("of steps", "{steps:,}", "r"), *_FAMILY_COLUMNS]
_SYNTHETIC_PUBLISHED = [
    ("Published", "{source}: {claim}", "l"),
    ("Ours", "{ours}", "l"),
    ("Agrees when", "{rule}", "l"),
    ("Agrees", "{agrees}", "l"),
]
# Tables that are one key of a result file other than its `rows`: name -> (file, key).
VIEWS = {
    "synthetic_decisive": ("synthetic_decisive", "level_rows"),
    "synthetic_decisive_onsets": ("synthetic_decisive", "onset_rows"),
    "synthetic_decisive_published": ("synthetic_decisive", "published"),
}
_ACCEL_STEP = [
    ("model", "{model}", "l"),
    ("kernels", "{kernels}", "l"),
    ("memory", "{memory_dtype}", "l"),
    ("remat rerun", "{rerun}", "l"),
    ("loops", "{loops}", "l"),
    ("B × T", "{batch_size} × {seq_len}", "r"),
    ("tokens/s", "{tokens_per_s:,.0f}", "r"),
    ("step (s)", "{step_time_s:.2f}", "r"),
    ("MFU (%)", "{mfu_pct:.1f}", "r"),
    ("peak memory (GiB)", "{peak_mem_gib:.1f}", "r"),
    ("ops/token", "{ops_per_token:.1f}", "r"),
    ("compile (s)", "{compile_s:.0f}", "r"),
    ("outcome", "{outcome}", "l"),
]
_ACCEL_CHECK = [
    ("check", "{what}", "l"),
    ("passed", "{ok}", "l"),
    ("relative error", "{rel_err:.2e}", "r"),
    ("bound", "{bound:.2e}", "r"),
]
COLUMNS = {
    "accel_h100_step": _ACCEL_STEP,
    "accel_h100_check": _ACCEL_CHECK,
    "bench_small": [
        ("model", "{model}", "l"),
        ("params", "{params_m:.2f}M", "r"),
        ("tokens/s", "{tokens_per_s:,}", "r"),
        ("vs Transformer++", "{vs_transformer:.2f}×", "r"),
        ("MFU", "{mfu_pct:.1f} %", "r"),
        ("peak RSS", "{peak_rss_gib:.2f} GiB", "r"),
    ],
    "bench_small_runs": [
        ("CPU", "{cpu}", "l"),
        ("code", "{code}", "l"),
        ("matmul peak", "{peak_gflops:.1f} GFLOP/s", "r"),
        ("GPN+M MFU", "{gpn_m_mfu_pct:.1f} %", "r"),
        ("vs T++", "{vs_transformer:.2f}×", "r"),
        ("alternated: vs T++, MFU", "{alternated}", "r"),
        ("GPN MFU", "{gpn_mfu_pct:.1f} %", "r"),
        ("GPN+M peak RSS", "{rss_gib:.2f} GiB", "r"),
    ],
    "step_memory": [
        ("model", "{model}", "l"),
        ("minor faults a step: default → reuse", "{faults_default:,} → {faults_reuse:,}", "r"),
        ("step time, reuse / default", "×{step_time_ratio:.3f}", "r"),
        ("peak RSS: default → reuse", "{rss_default_gib:.2f} → {rss_reuse_gib:.2f} GiB", "r"),
    ],
    "memory_kernels_ab": [
        ("change", "{change}", "l"),
        ("GPN+M step time", "×{ratio:.3f}", "r"),
        ("rounds faster", "{faster}", "r"),
    ],
    "remat_rerun_ab": [
        ("model", "{model}", "l"),
        ("remat segment", "{remat_segment}", "r"),
        (
            "step: token by token → at once",
            "{median_token_by_token_s:.3f} → {median_at_once_s:.3f} s",
            "r",
        ),
        ("at once / token by token", "×{ratio:.3f}", "r"),
        ("rounds faster", "{faster}", "r"),
    ],
    "roofline_130m": [
        ("B per chip", "{batch_per_chip}", "r"),
        ("memory_dtype", "{memory_dtype}", "l"),
        ("bytes/token", "{bytes_per_token:,.0f}", "r"),
        ("of which weights / memory matrix", "{weights_bytes:,.0f} / {memory_bytes:,.0f}", "r"),
        ("H100 bound", "{h100:,.0f}", "r"),
        ("H200", "{h200:,.0f}", "r"),
        ("v5e", "{v5e:,.0f}", "r"),
        ("v5p", "{v5p:,.0f}", "r"),
    ],
    "compare_tiny": [
        ("Model", "{model}", "l"),
        ("Params", "{params:,}", "r"),
        ("Layers", "{layers}", "r"),
        ("State dim", "{state_dim}", "r"),
        ("Memory cells / state size", "{cells}", "l"),
        ("Held-out PPL", "{heldout_ppl:.2f}", "r"),
    ],
    "compare_small": _COMPARE,
    "compare_small_pydoc": _COMPARE,
    "window_ppl": [
        ("seed-0 run", "{model}", "l"),
        ("read", "{read:.2f}", "r"),
        ("unread", "{unread:.2f}", "r"),
        ("held-out", "{heldout:.2f}", "r"),
        ("memorisation", "{memorisation_pct:+.1f} %", "r"),
        ("held-out shift", "{shift_pct:+.1f} %", "r"),
    ],
    "mqar_sweep": [
        ("Pairs", "{pairs}", "r"),
        ("T", "{seq_len}", "r"),
        ("Width", "{width}", "r"),
        ("Model", "{model}", "l"),
        ("Params", "{params:,}", "r"),
        ("Best LR", "{best_lr:g}", "r"),
        ("Accuracy (mean over seeds)", "{accuracy:.3f}", "r"),
        ("Seeds", "{seeds}", "l"),
    ],
    "synthetic_decisive": _SYNTHETIC_LEVELS,
    "synthetic_decisive_onsets": _SYNTHETIC_ONSETS,
    "synthetic_decisive_published": _SYNTHETIC_PUBLISHED,
    "synthetic_decisive_bench": _SYNTHETIC_BENCH,
    "synthetic_quick": _SYNTHETIC,
    "synthetic_small": _SYNTHETIC,
    "synthetic_quick_bench": _SYNTHETIC_BENCH,
    "synthetic_small_bench": _SYNTHETIC_BENCH,
    "stateful": [
        ("position", "{run}", "l"),
        ("0-128", "{b0_128:.2f}", "r"),
        ("128-256", "{b128_256:.2f}", "r"),
        ("256-512", "{b256_512:.2f}", "r"),
        ("512-1k", "{b512_1k:.2f}", "r"),
        ("1k-1536", "{b1k_1536:.2f}", "r"),
        ("all", "{all:.2f}", "r"),
    ],
    "prepare_bench": _PREPARE,
    "prepare_bench_log": _PREPARE,
    "prepare_loader": [
        ("layout", "{layout}", "l"),
        ("batch", "{batch}", "r"),
        ("Grain batches/s", "{grain_batches_per_s:,.1f}", "r"),
        ("hand-written loop batches/s", "{hand_written_batches_per_s:,.1f}", "r"),
    ],
}


# Tables whose rows come from several result files, each one command's record (e.g. one
# `gpn_jax.aot --out` compile, or its batch search whose `trials` are the rows).
COLLECTIONS = {
    "aot_130m": (
        "aot_130m_v5e_2x2_b16",
        "aot_130m_v5e_2x2_b24",
        "aot_130m_v5e_2x2_b32",
        "aot_130m_v5e_2x2",
        "aot_130m_v6e_1x1",
        "aot_130m_v5p_2x2x1",
        "aot_130m_v5p_2x2x1_b256",
    ),
}
_AOT = [
    ("topology", "{topology}", "l"),
    ("per-chip batch", "{batch_per_device}", "r"),
    ("fits", "{fits_word}", "l"),
    ("peak / HBM per chip", "{peak_gib:.1f} / {hbm_gib:.1f} GiB", "r"),
    ("M traffic, HLO / minimum", "{traffic_ratio:.2f}×", "r"),
    ("M in VMEM in the per-token loops", "{vmem_word}", "l"),
]
COLUMNS["aot_130m"] = _AOT
# the same step compiled by today's window with its remat segments rerun token by token and
# at once (`model.remat_parallel`), XLA's passes
COLLECTIONS["aot_130m_at_once"] = tuple(
    f"aot_130m_{chip}_{rerun}"
    for chip in ("v5e_2x2_b32", "v6e_1x1_b64")
    for rerun in ("token_by_token", "at_once")
)
COLUMNS["aot_130m_at_once"] = (
    _AOT[:2]
    + [("remat rerun", "{rerun}", "l")]
    + _AOT[2:4]
    + [
        ("M traffic per token, HLO (minimum)", "{traffic_mb:.1f} MB ({minimum_mb:.1f})", "r"),
        _AOT[5],
    ]
)
# the same step with `model.kernels=pallas` (the Mosaic variant of the memory's passes)
COLLECTIONS["aot_130m_pallas"] = (
    "aot_130m_v5e_1x1_b32_pallas",
    "aot_130m_v5e_2x2_b32_pallas",
    "aot_130m_v6e_1x1_b64_pallas",
    "aot_130m_v5p_2x2x1_b256_pallas",
)
COLUMNS["aot_130m_pallas"] = _AOT[:5]
# XLA:CPU's compile of the same schedule at a tiny size: its traffic over M against the minimum
COLLECTIONS["aot_cpu"] = ("aot_tiny_cpu",)
COLUMNS["aot_cpu"] = [
    ("compiled for", "{device_kind}", "l"),
    ("config", "{config_name}", "l"),
    ("per-device batch × T", "{batch_per_device} × {seq_len}", "r"),
    ("kernels", "{kernels}", "l"),
    ("M traffic, HLO / minimum", "{traffic_ratio:.2f}×", "r"),
]
# NVIDIA GPUs compiled from this host (`--topology=h100`): the three 130M families at per-GPU
# batches 32, 64 and 128, the GPN+M step as the H100 run measured it (Pallas, bfloat16 memory),
# and on an H100 the step the device plan measures first (rerun at once, loops unrolled)
COLLECTIONS["aot_130m_gpu"] = tuple(
    f"aot_130m_{gpu}_{family}"
    for gpu in ("h100", "h200")
    for family in ("gpn_m", "gpn_m_at_once", "transformer", "gdn")
) + ("aot_130m_h100_gpn_m_at_once_unroll4",)
COLUMNS["aot_130m_gpu"] = [
    ("GPU", "{topology}", "l"),
    ("model", "{config_name}", "l"),
    ("variant", "{variant}", "l"),
    ("batch", "{batch_per_device}", "r"),
    ("fits", "{fits_word}", "l"),
    ("peak / usable", "{peak_gib:.1f} / {hbm_gib:.1f} GiB", "r"),
    ("measured peak (H100 run)", "{measured_gib:.1f}", "r"),
    ("M traffic, HLO / minimum", "{traffic_ratio:.2f}", "r"),
]
# the same compiles, one row per topology: the per-chip batch limits they found (GPUs: the
# GPN+M step as the H100 run measured it)
COLLECTIONS["aot_130m_limits"] = COLLECTIONS["aot_130m"] + ("aot_130m_h100", "aot_130m_h200")
COLUMNS["aot_130m_limits"] = [
    ("topology", "{topology}", "l"),
    ("chip", "{device_kind}", "l"),
    ("usable HBM per chip", "{hbm_gib:.0f} GiB", "r"),
    ("largest per-chip batch that fits", "{largest_fitting}", "r"),
    ("smallest that does not", "{smallest_failing}", "r"),
]


# The paper's run (docs/paper_run.md): a run's evaluation (`gpn_jax.evaluate --out`) beside the
# paper's Table 1, and a run's zero-shot scores (`gpn_jax.harness --out`), one table per kind;
# `--table KIND --data ...` prints one from the user's files, `--save` keeps it as a result file.
PAPER_TABLE1 = {  # held-out PPL on FineWeb-Edu, LAMBADA acc / PPL (the paper's protocol)
    "gpn_m_1l": ("GPN+M (1L)", 18.06, 0.146, 33.45),
    "gpn_m_2l": ("GPN+M (2L)", 16.95, 0.160, 27.39),
    "gpn_1l": ("GPN (1L)", 23.51, 0.015, 263.6),
    "transformer": ("Transformer++", 16.05, 0.223, 18.99),
    "gdn": ("Gated DeltaNet", 15.34, 0.208, 17.23),
}
COLUMNS["paper_run"] = [
    ("Model", "{model}", "l"),
    ("step", "{step}", "r"),
    ("Held-out PPL", "{ppl}", "r"),
    ("paper", "{paper_ppl}", "r"),
    ("LAMBADA acc", "{lambada_acc}", "r"),
    ("paper", "{paper_lambada_acc}", "r"),
    ("LAMBADA PPL", "{lambada_ppl}", "r"),
    ("paper", "{paper_lambada_ppl}", "r"),
    ("LAMBADA acc / PPL, harness protocol", "{harness_lambada}", "r"),
]
COLUMNS["chip_hours_130m"] = [
    ("model", "{model}", "l"),
    ("per-chip batch", "{batch_per_chip}", "r"),
    ("tokens per run", "{tokens_per_run:,}", "r"),
    ("v5e chip-hours", "{v5e_chip_hours:,.1f}", "r"),
    ("v5p", "{v5p_chip_hours:,.1f}", "r"),
    ("H100", "{h100_chip_hours:,.1f}", "r"),
    ("H200", "{h200_chip_hours:,.1f}", "r"),
    ("bound by", "{bound_by}", "l"),
]


def _num(value, fmt: str) -> str:
    return (
        "—" if not isinstance(value, int | float) or isinstance(value, bool) else format(value, fmt)
    )


def _read_data(path: str) -> dict:
    """A JSON object from a user's file, checked like a result file (size, JSON, object)."""
    if not os.path.isfile(path):
        raise ResultError(f"{path}: no such file; write it with the command's --out")
    if os.path.getsize(path) > MAX_BYTES:
        raise ResultError(f"{path}: larger than {MAX_BYTES} bytes; not a results file")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise ResultError(
            f"{path}: not valid JSON ({e}); rewrite it with the command's --out"
        ) from e
    if not isinstance(data, dict):
        raise ResultError(f"{path}: top level must be a JSON object")
    return data


def paper_run_rows(specs: list[str]) -> list[dict]:
    """`KEY=FILE` per run (KEY a row of PAPER_TABLE1, FILE its `gpn_jax.evaluate --out`)."""
    rows = []
    for spec in specs:
        key, _, path = spec.partition("=")
        if key not in PAPER_TABLE1 or not path:
            raise ResultError(
                f"--data {spec!r}: use KEY=FILE with KEY one of {', '.join(PAPER_TABLE1)}"
            )
        data = _read_data(path)
        label, ppl, acc, lppl = PAPER_TABLE1[key]
        lmb = data.get("lambada") if isinstance(data.get("lambada"), dict) else {}
        paper, harness = lmb.get("paper") or {}, lmb.get("harness") or {}
        run = data.get("run") if isinstance(data.get("run"), dict) else {}
        rows.append({
            "model": label, "step": _num(run.get("step"), "d"),
            "ppl": _num((data.get("ppl") or {}).get("ppl"), ".2f"), "paper_ppl": f"{ppl:.2f}",
            "lambada_acc": _num(paper.get("acc"), ".3f"), "paper_lambada_acc": f"{acc:.3f}",
            "lambada_ppl": _num(paper.get("ppl"), ".2f"), "paper_lambada_ppl": f"{lppl:.2f}",
            "harness_lambada": f"{_num(harness.get('acc'), '.3f')} / {_num(harness.get('ppl'), '.2f')}",
        })  # fmt: skip
    return rows


def zero_shot_rows(paths: list[str]) -> tuple[list[dict], list[tuple[str, str, str]]]:
    """One row per `gpn_jax.harness --out` file; the columns every file has a score for, the
    papers' first and in their order, then the average of their six accuracy columns."""
    order = ["Wiki. ppl", "LMB. ppl", "LMB. acc", "PIQA acc", "Hella. acc_n", "Wino. acc",
             "ARC-e acc", "ARC-c acc_n"]  # fmt: skip
    rows, seen = [], []
    for path in paths:
        data = _read_data(path)
        scores = data.get("rows")
        if not isinstance(scores, list) or not all(isinstance(r, dict) for r in scores):
            raise ResultError(f"{path}: 'rows' must be a list of objects (gpn_jax.harness --out)")
        row = {"model": str(data.get("label", os.path.basename(path)))}
        for r in scores:
            column, value = str(r.get("column", "?")), r.get("value")
            row[column] = value
            seen += [] if column in seen else [column]
        rows.append(row)
    columns = [c for c in order if c in seen] + [c for c in seen if c not in order]
    accs = [c for c in order if "acc" in c and c != "LMB. ppl"]
    if all(c in seen for c in accs):
        for row in rows:
            vals = [row.get(c) for c in accs]
            ok = all(isinstance(v, int | float) for v in vals)
            row["Avg."] = sum(vals) / len(vals) if ok else None
        columns.append("Avg.")
    keys = [(c, f"c{i}") for i, c in enumerate(columns)]
    out = [{"model": r["model"]} | {k: _num(r.get(c), ".2f" if "ppl" in c or "perplexity" in c
                                               else ".3f") for c, k in keys} for r in rows]  # fmt: skip
    return out, [("Model", "{model}", "l")] + [(c, "{" + k + "}", "r") for c, k in keys]


def print_table(kind: str, data_args: list[str], save: str | None) -> str:
    """The Markdown table of `kind` over the user's files; `save` also writes it as a result file."""
    if kind == "paper_run":
        rows, cols = paper_run_rows(data_args), COLUMNS["paper_run"]
    elif kind == "zero_shot":
        rows, cols = zero_shot_rows(data_args)
    else:
        raise ResultError(f"--table {kind!r}: use paper_run or zero_shot")
    fmt = _Fields()
    lines = ["| " + " | ".join(h for h, _, _ in cols) + " |"]
    lines.append("|" + "|".join("---:" if a == "r" else "---" for _, _, a in cols) + "|")
    lines += ["| " + " | ".join(fmt.vformat(s, (), r) for _, s, _ in cols) + " |" for r in rows]
    if save:
        record = {
            "command": "python tools/render_results.py " + " ".join(
                [f"--table={kind}"] + [f"--data={d}" for d in data_args]),
            "date": datetime.date.today().isoformat(),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "version": "as the --data files say (gpn_jax.evaluate / gpn_jax.harness --out)",
            "columns": [[h, s, a] for h, s, a in cols], "rows": rows,
        }  # fmt: skip
        _write(save, json.dumps(record, indent=1) + "\n")
    return "\n".join(lines) + "\n"


class ResultError(Exception):
    """A result file or page that cannot be rendered; the message is the one line to print."""


class _Fields(string.Formatter):
    """str.format over a row, with only plain field names (no attribute or index access)."""

    def get_field(self, field_name, args, kwargs):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", field_name):
            raise KeyError(field_name)
        return kwargs[field_name], field_name

    def format_field(self, value, format_spec):
        """None (a figure a record did not reach) reads "—"."""
        return "—" if value is None else super().format_field(value, format_spec)


def load(root: str, name: str, required: tuple[str, ...] = REQUIRED) -> dict:
    """The checked contents of experiments/results/NAME.json, with the `required` keys."""
    rel = os.path.join(RESULTS, f"{name}.json")
    if not _NAME.match(name):
        raise ResultError(f"marker names result {name!r}: use [a-z0-9_]+ (a file in {RESULTS}/)")
    path = os.path.join(root, rel)
    if not os.path.isfile(path):
        raise ResultError(f"{rel}: no such result file; write it with the command's --out")
    if os.path.getsize(path) > MAX_BYTES:
        raise ResultError(f"{rel}: larger than {MAX_BYTES} bytes; a result file is a small table")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise ResultError(
            f"{rel}: not valid JSON ({e}); rewrite it with the command's --out"
        ) from e
    if not isinstance(data, dict):
        raise ResultError(f"{rel}: top level must be an object with keys {', '.join(REQUIRED)}")
    missing = [k for k in required if k not in data]
    if missing:
        raise ResultError(f"{rel}: missing {', '.join(missing)}; every result records them")
    if data.get("provenance", "written") not in PROVENANCE:
        raise ResultError(
            f"{rel}: 'provenance' must be one of {', '.join(PROVENANCE)}, got "
            f"{data['provenance']!r}"
        )
    if "rows" not in required:
        return data
    rows = data["rows"]
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise ResultError(f"{rel}: 'rows' must be a non-empty list of objects")
    return data


# Tables computed from several result files (DERIVED, below the function of each)
COLUMNS["accel_h100_time"] = [
    ("part", "{part}", "l"),
    ("µs per token", "{us_per_token:.2f}", "r"),
    ("share", "{share:.0%}", "r"),
]


def _h100_time_split(root: str) -> dict:
    """The H100 run's Pallas bfloat16 GPN+M step at B = 128 (`accel_h100_step`) split into its
    parts' floors (`roofline.time_split`) with what its own compiled program moves and launches
    (the file's `compiled`) and the roofline's analytic bytes (`roofline_130m`)."""
    from gpn_jax.benchmarks import roofline

    step, run = _h100_run(root)
    rows = roofline.time_split(
        run, step["compiled"], _analytic(root, "roofline_130m"),
        step["copy_bandwidth_gb_per_s"] * 1e9,
    )  # fmt: skip
    members = [f"{RESULTS}/{n}.json" for n in ("accel_h100_step", "roofline_130m")]
    return {"rows": rows, "members": members}


def _h100_run(root: str) -> tuple[dict, dict]:
    """(the H100 run's step file, its Pallas bfloat16 GPN+M record at B = 128, rerun token
    by token)."""
    step = load(root, "accel_h100_step")
    key = ("GPN+M 130M", "pallas", "bfloat16", "token by token", 128)
    fields = ("model", "kernels", "memory_dtype", "rerun", "batch_size")
    return step, next(r for r in step["rows"] if tuple(r.get(f) for f in fields) == key)


def _at_128(root: str, stem: str) -> dict:
    """A GPU compile file's trial at 128 sequences per device."""
    return next(t for t in load(root, stem, required=REQUIRED[:3])["trials"]
                if t["batch_per_device"] == 128)  # fmt: skip


def _analytic(root: str, stem: str) -> dict:
    """A roofline file's row for 128 sequences per chip with the memory in bfloat16."""
    return next(r for r in load(root, stem)["rows"]
                if (r["batch_per_chip"], r["memory_dtype"]) == (128, "bfloat16"))  # fmt: skip


def _h100_rerun(root: str) -> dict:
    """The same step with its remat segments rerun token by token, as the H100 run's own
    program and as compiled for an H100 here today, and at once (`model.remat_parallel`,
    compiled here): the floors of the parts that bytes and launches set (`roofline.floors`, at
    the run's copy bandwidth), the matrix FLOPs (the same in all), their sum, 70 % of the
    data-sheet bound for each one's bytes, the per-token operations and the peak (the run's
    measured, the others' as compiled)."""
    from gpn_jax.benchmarks import roofline

    step, run = _h100_run(root)
    bandwidth = step["copy_bandwidth_gb_per_s"] * 1e9
    run_program = step["compiled"] | {"peak_bytes_per_device": run["peak_mem_gib"] * 2**30}
    programs = {"run": (run_program, "roofline_130m"),
                "token_by_token": (_at_128(root, "aot_130m_h100_gpn_m"), "roofline_130m"),
                "at_once": (_at_128(root, "aot_130m_h100_gpn_m_at_once"),
                            "roofline_130m_at_once")}  # fmt: skip
    flops_us = run["mfu_pct"] / 100 * 1e6 / run["tokens_per_s"]
    cols = {}
    for col, (compiled, analytic) in programs.items():
        bytes_ = _analytic(root, analytic)
        parts = [us for _, us in roofline.floors(compiled, bytes_, bandwidth, 128)] + [flops_us]
        cols[col] = parts + [sum(parts), 1e6 / (0.7 * bytes_["h100"]),
                             compiled["ops_per_token"], compiled["peak_bytes_per_device"] / 2**30]  # fmt: skip
    names = [
        "the memory matrix's HBM traffic, as compiled (µs per token)",
        "weights, activations and logits, analytic bytes (µs)",
        f"per-token loop operations × {roofline.OP_LATENCY_S['gpu'] * 1e6:.0f} µs / B (µs)",
        "matrix FLOPs at the data-sheet peak, the same in all (µs)",
        "sum of these floors (µs)",
        "70 % of the data-sheet bound for its bytes (µs)",
        "per-token loop operations per token",
        "peak memory, measured on the run or as compiled (GiB)",
    ]
    rows = [{"part": n} | {c: v[i] for c, v in cols.items()} for i, n in enumerate(names)]
    rows.append({"part": "measured step (µs per token)", "run": 1e6 / run["tokens_per_s"],
                 "token_by_token": None, "at_once": None})  # fmt: skip
    stems = ["accel_h100_step", "roofline_130m", "aot_130m_h100_gpn_m",
             "aot_130m_h100_gpn_m_at_once", "roofline_130m_at_once"]  # fmt: skip
    return {"rows": rows, "members": [f"{RESULTS}/{n}.json" for n in stems]}


COLUMNS["accel_h100_rerun"] = [
    ("", "{part}", "l"),
    ("token by token: the H100 run's program", "{run:.2f}", "r"),
    ("token by token, compiled here", "{token_by_token:.2f}", "r"),
    ("at once, compiled here", "{at_once:.2f}", "r"),
]


def _h100_loops(root: str) -> dict:
    """The step the H100 run measured (its own HLO, `accel_h100_step`'s `compiled`) and the
    step rerun at once (compiled here, `aot_130m_h100_gpn_m_at_once` at B = 128), as compiled:
    the per-token loops' operations per token step and HBM bytes per token by kind of
    operation (`roofline.loop_kinds`), the whole step's bytes over every array against the
    roofline's analytic count, and their times: the bytes at the run's copy bandwidth, the
    launches at the roofline's per-operation latency, 70 % of the data-sheet bound."""
    from gpn_jax.benchmarks import roofline

    step, run = _h100_run(root)
    bandwidth, latency = step["copy_bandwidth_gb_per_s"] * 1e9, roofline.OP_LATENCY_S["gpu"]
    progs = {"token_by_token": (step["compiled"], _analytic(root, "roofline_130m")),
             "at_once": (_at_128(root, "aot_130m_h100_gpn_m_at_once"),
                         _analytic(root, "roofline_130m_at_once"))}  # fmt: skip
    rows = [{"part": k} for k in roofline.KINDS]
    rows += [{"part": "the per-token loops"}, {"part": "the whole step, every array"},
             {"part": "the roofline's analytic count"}]  # fmt: skip
    times = [{"part": p} for p in (
        "the whole step's bytes at the run's copy bandwidth (µs per token)",
        f"the loops' launches, operations × {latency * 1e6:.0f} µs / B (µs per token)",
        "measured step (µs per token)",
        "70 % of the data-sheet bound for the analytic bytes (µs per token)")]  # fmt: skip
    for col, (compiled, analytic) in progs.items():
        kinds = compiled["per_token_loop_kinds"]
        for row, kind in zip(rows[:4], roofline.KINDS, strict=True):
            row |= {
                f"{col}_ops": kinds[kind]["ops"],
                f"{col}_mb": kinds[kind]["bytes_per_token"] / 1e6,
            }
        rows[4] |= {f"{col}_ops": compiled["ops_per_token"],
                    f"{col}_mb": sum(k["bytes_per_token"] for k in kinds.values()) / 1e6}  # fmt: skip
        rows[5] |= {f"{col}_ops": None, f"{col}_mb": compiled["bytes_per_token_hlo"] / 1e6}
        rows[6] |= {f"{col}_ops": None, f"{col}_mb": analytic["bytes_per_token"] / 1e6}
        measured = 1e6 / run["tokens_per_s"] if col == "token_by_token" else None
        for row, us in zip(times, (compiled["bytes_per_token_hlo"] / bandwidth * 1e6,
                                   compiled["ops_per_token"] * latency / 128 * 1e6, measured,
                                   1e6 / (0.7 * analytic["h100"])), strict=True):  # fmt: skip
            row |= {f"{col}_ops": None, f"{col}_mb": us}
    members = [f"{RESULTS}/{n}.json" for n in ("accel_h100_step", "roofline_130m",
               "aot_130m_h100_gpn_m_at_once", "roofline_130m_at_once")]  # fmt: skip
    return {"rows": rows + times, "members": members}


COLUMNS["accel_h100_loops"] = [
    ("", "{part}", "l"),
    ("token by token (the H100 run): operations per token step", "{token_by_token_ops:.2f}", "r"),
    ("MB per token, or µs", "{token_by_token_mb:.2f}", "r"),
    ("at once (compiled here): operations per token step", "{at_once_ops:.2f}", "r"),
    ("MB per token, or µs", "{at_once_mb:.2f}", "r"),
]
DERIVED = {
    "accel_h100_time": _h100_time_split,
    "accel_h100_rerun": _h100_rerun,
    "accel_h100_loops": _h100_loops,
}


def load_view(root: str, name: str) -> dict:
    """A VIEWS table: the rows under one key of a result file, linked to that file."""
    stem, key = VIEWS[name]
    data = load(root, stem)
    rows = data.get(key)
    rel = os.path.join(RESULTS, f"{stem}.json")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise ResultError(f"{rel}: {key!r} must be a non-empty list of objects")
    return data | {"rows": rows, "members": [rel]}


def _aot_row(record: dict, topology: str) -> dict:
    """One compile of `gpn_jax.aot` as a table row (sizes in GiB, the traffic as a ratio)."""
    vmem = record.get("m_in_vmem_per_token_loops")
    hbm = record.get("hbm_bytes_per_device")
    minimum, hlo = record["memory_bytes_per_token_min"], record["memory_bytes_per_token_hlo"]
    variant = [record.get("kernels"), record.get("memory_dtype")] if hlo else []
    variant += ["remat rerun at once"] if record.get("remat_parallel") else []
    unroll = record.get("scan_unroll") or 1
    variant += [f"{unroll} tokens per loop iteration"] if unroll > 1 else []
    variant += [f"{record['attention']} attention"] if record.get("attention") else []
    return record | {
        "topology": topology or record.get("device_kind", "?"),
        "fits_word": "yes" if record["fits"] else "no",
        "peak_gib": record["peak_bytes_per_device"] / 2**30,
        "hbm_gib": float("nan") if hbm is None else hbm / 2**30,
        "traffic_ratio": None
        if hlo is None  # no memory (a baseline), or the compile did not fit
        else hlo / minimum
        if minimum  # 0 where the memory and its stack stay on chip
        else float("nan"),
        "variant": ", ".join(variant) or "—",
        "vmem_word": "—" if vmem is None else ("yes" if vmem else "no"),
        "rerun": "at once" if record.get("remat_parallel") else "token by token",
        "traffic_mb": None if hlo is None else hlo / 1e6,
        "minimum_mb": None if hlo is None else minimum / 1e6,
    }


def load_collection(root: str, name: str) -> dict:
    """The rows of a collection (COLLECTIONS): each member's `trials`, or the member itself;
    a compile listed twice (same topology and batch) keeps its first record."""
    rows, members = [], []
    for member in COLLECTIONS[name]:
        rel = os.path.join(RESULTS, f"{member}.json")
        data = load(root, member, required=REQUIRED[:3])
        members.append(rel)
        trials = data.get("trials") or [data]
        if not isinstance(trials, list) or not all(isinstance(t, dict) for t in trials):
            raise ResultError(f"{rel}: 'trials' must be a list of objects")
        try:
            config = re.search(r"--config=(?:\S*/)?([\w.]+?)(?:\.py)?(?:\s|:|$)", data["command"])
            extra = {"config_name": config.group(1) if config else "?"}
            rows += [_aot_row(t | extra, data.get("topology")) for t in trials]
        except (KeyError, TypeError, ZeroDivisionError) as e:
            raise ResultError(f"{rel}: not a gpn_jax.aot record ({type(e).__name__}: {e})") from e
    # one row per compile: a batch search's trial repeats a compile listed before it
    unique = {}
    for r in rows:
        unique.setdefault((r["topology"], r["config_name"], r["variant"], r["batch_per_device"]), r)
    order = lambda r: (r["topology"], r["config_name"], r["variant"], r["batch_per_device"])  # noqa: E731
    rows = sorted(unique.values(), key=order)
    if name.endswith("_limits"):
        rows = _limits(rows)
    if name == "aot_130m_gpu":
        rows = _with_measured(root, rows)
    return {"rows": rows, "members": members}


# the H100 run's step records (`accel_h100_step.json`) by the compile's config name
_RUN_MODELS = {
    "GPN+M 130M": "gpn_m_1l_130m",
    "Transformer++ 130M": "transformer_130m",
    "Gated DeltaNet 130M": "gdn_130m",
}


def measured_peaks(root: str) -> dict:
    """{(config name, kernels, memory dtype, rerun at once, batch): peak GiB} of the H100
    run's records."""
    out = {}
    for r in load(root, "accel_h100_step")["rows"]:
        if r.get("peak_mem_gib") is not None and r["model"] in _RUN_MODELS:
            at_once = r.get("rerun") == "rerun at once"  # `accel_plan.AT_ONCE`
            key = (_RUN_MODELS[r["model"]], r["kernels"], r["memory_dtype"], at_once,
                   r["batch_size"])  # fmt: skip
            out[key] = r["peak_mem_gib"]
    return out


def _with_measured(root: str, rows: list[dict]) -> list[dict]:
    """Each H100 row with the peak the H100 run measured for the same step, where it did."""
    peaks = measured_peaks(root)
    for r in rows:
        at_once = bool(r.get("remat_parallel"))
        key = (r["config_name"], r.get("kernels"), r.get("memory_dtype"), at_once,
               r["batch_per_device"])  # fmt: skip
        r["measured_gib"] = peaks.get(key) if r["topology"] == "h100" else None
    return rows


def _limits(rows: list[dict]) -> list[dict]:
    """One row per topology: the largest per-chip batch that fit, the smallest that did not."""
    out = {}
    for r in rows:
        t = out.setdefault(r["topology"], r | {"largest_fitting": None, "smallest_failing": None})
        b = r["batch_per_device"]
        if r["fits"] and (t["largest_fitting"] is None or b > t["largest_fitting"]):
            t["largest_fitting"] = b
        if not r["fits"] and (t["smallest_failing"] is None or b < t["smallest_failing"]):
            t["smallest_failing"] = b
    return list(out.values())


def table(name: str, data: dict, page_dir: str, root: str) -> str:
    """The Markdown table of one result set, with a line naming its data file and command."""
    rows = data["rows"]
    saved = [tuple(c) for c in data.get("columns") or []]  # written by print_table's --save
    cols = COLUMNS.get(name) or saved or [(k, "{" + k + "}", "l") for k in rows[0]]
    fmt = _Fields()
    cells = []
    for i, row in enumerate(rows):
        try:
            cells.append([fmt.vformat(spec, (), row) for _, spec, _ in cols])
        except (KeyError, ValueError, TypeError) as e:
            raise ResultError(
                f"{RESULTS}/{name}.json: row {i} does not fit the table ({type(e).__name__}: {e}); "
                f"fix the row or the columns of {name!r} in tools/render_results.py"
            ) from e
    lines = ["| " + " | ".join(h for h, _, _ in cols) + " |"]
    lines.append("|" + "|".join("---:" if a == "r" else "---" for _, _, a in cols) + "|")
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in cells]
    lines.append("")
    lines.append(f"<sub>Data: {_data_link(name, data, page_dir, root)}.</sub>")
    return "\n".join(lines) + "\n"


def _data_link(name: str, data: dict, page_dir: str, root: str) -> str:
    """A link to the table's result file, or to the folder of a collection's files; a file
    transcribed by hand (`"provenance": "transcribed"`) says so."""
    members = data.get("members") or [os.path.join(RESULTS, f"{name}.json")]
    if len(members) == 1:
        rel = members[0]
        link = f"[{rel}]({os.path.relpath(os.path.join(root, rel), page_dir)})"
        if data.get("provenance") == "transcribed":
            link += ", transcribed from the measurement log, not written by its command"
        return link
    stem = os.path.commonprefix([os.path.basename(m) for m in members])
    folder = os.path.relpath(os.path.join(root, RESULTS), page_dir)
    if not stem:  # files of different kinds (a DERIVED table): each named
        names = ", ".join(
            f"[{os.path.basename(m)}]({folder}/{os.path.basename(m)})" for m in members
        )
        return f"{names} in {RESULTS}/"
    return f"`{stem}*.json` in [{RESULTS}/]({folder}/)"


def render_page(text: str, page_dir: str, root: str) -> str:
    """The page with every results block replaced by the table of its data."""

    def block(m):
        name = m.group("name")
        if name in COLLECTIONS:
            data = load_collection(root, name)
        elif name in DERIVED:
            data = DERIVED[name](root)
        elif name in VIEWS:
            data = load_view(root, name)
        else:
            data = load(root, name)
        return (
            f"<!-- results:{name} -->\n{table(name, data, page_dir, root)}<!-- /results:{name} -->"
        )

    return _MARKER.sub(block, text)


def pages(root: str) -> list[str]:
    """README.md and every docs/*.md (no subdirectories, no links followed)."""
    out = [os.path.join(root, "README.md")]
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        out += sorted(
            os.path.join(docs, f)
            for f in os.listdir(docs)
            if f.endswith(".md") and not os.path.islink(os.path.join(docs, f))
        )
    return [p for p in out if os.path.isfile(p)]


def _write(path: str, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".render-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def run(root: str, check: bool) -> list[str]:
    """Renders (or, with `check`, compares) every page; returns the pages that differ."""
    rendered = {}
    for path in pages(root):
        with open(path, encoding="utf-8") as f:
            old = f.read()
        new = render_page(old, os.path.dirname(path), root)
        if new != old:
            rendered[path] = new
    if not check:
        for path, new in rendered.items():
            _write(path, new)
    return [os.path.relpath(p, root) for p in rendered]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a table is out of date")
    parser.add_argument("--root", default=ROOT, help="repository root (default: this checkout)")
    parser.add_argument("--table", help="print one table (paper_run, zero_shot) from --data files")
    parser.add_argument("--data", action="append", default=[], help="KEY=FILE (paper_run) or FILE")
    parser.add_argument("--save", help="with --table: also write the table as a result file")
    args = parser.parse_args(argv)
    try:
        if args.table:
            print(print_table(args.table, args.data, args.save), end="")
            return 0
        changed = run(args.root, args.check)
    except ResultError as e:
        print(f"render_results: {e}", file=sys.stderr)
        return 2
    if args.check and changed:
        print(
            f"render_results: tables out of date in {', '.join(changed)}; "
            "run `python tools/render_results.py` and commit the result",
            file=sys.stderr,
        )
        return 1
    print(f"render_results: {'rewrote ' + ', '.join(changed) if changed else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
