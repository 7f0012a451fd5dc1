"""docs/paper_run.md: every command it shows names real flags, config fields and files, and
the rehearsal (launch/rehearse.sh) runs its `bash rehearse` blocks end to end on this CPU."""

import functools
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests import REPO_ROOT as ROOT
from tests.environment import FAST_COMPILE


def _load(path: str):
    """A script of the checkout (launch/, tools/: not packages) as a module."""
    spec = importlib.util.spec_from_file_location(
        os.path.basename(path)[:-3], os.path.join(ROOT, path)
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rehearsal = _load("launch/rehearsal.py")
rr = _load("tools/render_results.py")

PAGE = os.path.join(ROOT, "docs", "paper_run.md")
TEXT = open(PAGE, encoding="utf-8").read()
LAUNCH_README = open(os.path.join(ROOT, "launch", "README.md"), encoding="utf-8").read()
SCRIPTS = ["tpu_vm.sh", "gpu_single_node.sh", "slurm_multinode.sbatch", "job.sh", "setup_host.sh"]


def commands(text: str) -> list[list[str]]:
    """Every command of every bash block (continuations joined, `&&`/`;` split, the command
    string of an `ssh HOST "..."` parsed in turn), as words with $VARIABLES unexpanded."""
    out = []
    for m in rehearsal.FENCE.finditer(text):
        if m["info"].split()[:1] != ["bash"] or m["info"].split()[1:2] == ["env"]:
            continue
        body = re.sub(r"\\\n\s*", " ", m["body"])
        for line in body.splitlines():
            line = line.split(" # ")[0].strip()
            if not line or line.startswith(("for ", "done")):
                continue
            out += split_commands(shlex.split(line.removeprefix("do ")))
    return out


def split_commands(words: list[str]) -> list[list[str]]:
    out, cur = [], []
    for w in [*words, ";"]:
        if w in ("&&", ";", "|", "||"):
            if cur:
                out += split_commands(shlex.split(cur[2])) if cur[0] == "ssh" else [cur]
            cur = []
        else:
            cur.append(w.rstrip(";"))
    return out


ENV = dict(re.findall(r"(\w+)=(\S+)", "\n".join(rehearsal.blocks(TEXT, "env"))))


@functools.cache
def absl_flags(module: str) -> frozenset:
    """Flag names an entry point's parser accepts (its --helpfull)."""
    r = subprocess.run(
        [sys.executable, "-m", module, "--helpfull"], cwd=ROOT, capture_output=True, text=True,
        env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"), timeout=120,
    )  # fmt: skip
    names = frozenset(re.findall(r"^\s+--(?:\[no\])?([\w.]+)", r.stdout, re.MULTILINE))
    assert "config" in names or "workdir" in names or "input" in names, r.stdout[-2000:]
    return names


@functools.cache
def help_text(argv: tuple) -> str:
    r = subprocess.run(
        [sys.executable, *argv, "--help"], cwd=ROOT, capture_output=True, text=True,
        env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"), timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def config_of(words: list[str]):
    """The ConfigDict a command's --config=$VAR names (the env block's file)."""
    import importlib

    given = next(w.split("=", 1)[1] for w in words if w.startswith("--config="))
    path = ENV[given.lstrip("$")] if given.startswith("$") else given
    name = os.path.basename(path).split(".py")[0]
    return importlib.import_module(f"experiments.configs.{name}").get_config()


def has_field(config, dotted: str) -> bool:
    node = config
    for part in dotted.split("."):
        if not hasattr(node, "keys") or part not in node:
            return False
        node = node[part]
    return True


def train_flags(words: list[str]) -> list[str]:
    """The gpn_jax.train flags a launcher command passes on."""
    return [w for w in words if w.startswith("--") and w not in ("--spot", "--queued")]


def check_flags(words: list[str], accepted, config=None) -> list[str]:
    bad = []
    for w in (w for w in words if w.startswith("--")):
        name = w[2:].split("=", 1)[0]
        if name.startswith("config.") and config is not None:
            bad += [] if has_field(config, name[len("config.") :]) else [w]
        elif name not in accepted:
            bad.append(w)
    return bad


def test_every_flag_and_config_field_on_the_page_is_real():
    bad, seen = [], set()
    train = absl_flags("gpn_jax.train")
    for words in commands(TEXT):
        prog = words[0]
        if prog == "python" and words[1] == "-m":
            module, rest = words[2], words[3:]
        elif prog.startswith("gpn-"):
            module, rest = f"gpn_jax.{prog[4:]}", words[1:]
        elif prog in ("launch/tpu_vm.sh", "launch/gpu_single_node.sh", "launch/job.sh"):
            sub, rest = words[1], words[2:]
            seen.add(f"{prog} {sub}")
            usage = re.search(
                r"\{([\w|]+)\}", open(os.path.join(ROOT, prog)).read().split("usage: ")[-1]
            )
            assert sub in usage.group(1).split("|"), (prog, sub)
            flags = train_flags(rest)
            cfg = config_of(flags) if any(f.startswith("--config=") for f in flags) else None
            bad += check_flags(flags, train, cfg)
            continue
        elif prog == "sbatch":
            script = next(w for w in words if w.endswith(".sbatch"))
            seen.add(script)
            rest = words[words.index(script) + 1 :]
            bad += check_flags(rest, train, config_of(rest))
            continue
        elif prog == "python" and words[1] == "tools/render_results.py":
            text = help_text(("tools/render_results.py",))
            bad += [w for w in words[2:] if w.split("=")[0] not in text]
            continue
        else:  # mkdir, git, ...: not ours
            continue
        seen.add(module)
        if module == "gpn_jax.harness":
            text = help_text(("-m", "gpn_jax.harness"))
            bad += [w for w in rest if w.startswith("--") and w.split("=")[0] not in text]
            continue
        cfg = config_of(rest) if any(w.startswith("--config=") for w in rest) else None
        bad += check_flags(rest, absl_flags(module), cfg)
    assert not bad, f"flags or config fields the parsers do not know: {bad}"
    for want in ("gpn_jax.prepare", "gpn_jax.aot", "gpn_jax.evaluate", "gpn_jax.harness",
                 "gpn_jax.export", "launch/tpu_vm.sh train", "launch/tpu_vm.sh watch",
                 "launch/gpu_single_node.sh start", "launch/slurm_multinode.sbatch"):  # fmt: skip
        assert want in seen, f"the page no longer shows {want}"


def test_config_fields_named_in_prose_exist():
    """`config.x.y`, `--config.x.y` and `train.x`/`logging.x`/`mesh.x` in the page and the
    launch README are fields of the 130M configs (a model field of at least one family)."""
    from experiments.configs import gdn_130m, gpn_m_1l_130m, transformer_130m

    configs = [m.get_config() for m in (gpn_m_1l_130m, transformer_130m, gdn_130m)]
    text = TEXT + LAUNCH_README
    named = set(re.findall(r"`-{0,2}config\.([a-z_]+(?:\.[a-z_]+)+)", text))
    named |= set(re.findall(r"`((?:train|logging|mesh|data)\.[a-z_]+)`", text))
    named = {n for n in named if "*" not in n}
    assert {"mesh.axis_rules", "train.log_every"} <= named
    missing = [n for n in sorted(named) if not any(has_field(c, n) for c in configs)]
    assert not missing, f"not config fields: {missing}"


def test_files_the_page_and_the_launch_scripts_name_exist():
    texts = {"docs/paper_run.md": TEXT, "launch/README.md": LAUNCH_README}
    for s in SCRIPTS:
        texts[f"launch/{s}"] = open(os.path.join(ROOT, "launch", s)).read()
    missing = []
    for name, text in texts.items():
        for path in re.findall(
            r"\b((?:launch|experiments|gpn_jax|tools|docs|tests)/[\w./-]*\w)", text
        ):
            if "*" not in path and not os.path.exists(os.path.join(ROOT, path)):
                missing.append(f"{name}: {path}")
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", TEXT):
        if not os.path.exists(os.path.join(ROOT, "docs", target)):
            missing.append(f"docs/paper_run.md links {target}")
    assert not missing, missing


def test_rehearsal_runs_the_page_blocks_in_order_with_a_value_for_every_variable():
    blocks = rehearsal.blocks(TEXT)
    joined = "\n".join(blocks)
    order = ["gpn-prepare", "gpn_jax.aot", "tpu_vm.sh create", "tpu_vm.sh install",
             "tpu_vm.sh train", "gpu_single_node.sh start", "sbatch", "tpu_vm.sh attach",
             "gpn_jax.evaluate", "gpn_jax.harness", "gpn_jax.export", "--table=paper_run",
             "--table=zero_shot"]  # fmt: skip
    where = [joined.index(x) for x in order]
    assert where == sorted(where)
    used = set(re.findall(r"\$\{?(\w+)", joined)) - {"m"}
    defined = set(rehearsal.env_names(TEXT))
    assert used <= defined, f"variables with no Settings entry: {used - defined}"
    script = open(os.path.join(ROOT, "launch", "rehearse.sh")).read()
    unset = [v for v in defined if not re.search(rf"\b{v}=", script)]
    assert not unset, f"rehearse.sh gives no value to {unset}"


def test_harness_help_says_how_the_gpn_jax_model_is_used():
    text = help_text(("-m", "gpn_jax.harness"))
    assert text.startswith("usage: gpn-harness --model_args workdir=RUN")
    for words in ("--model gpn_jax", "workdir=DIR", "batch_size=B", "--tasks zero_shot",
                  "HF_DATASETS_OFFLINE=1", "--out FILE", "--include_path"):  # fmt: skip
        assert words in text, words


def test_render_paper_run_and_zero_shot_tables(tmp_path):
    ev = {"run": {"workdir": "w", "step": 10000, "family": "gpn"}, "ppl": {"ppl": 18.5},
          "lambada": {"paper": {"acc": 0.15, "ppl": 33.0}, "harness": {"acc": 0.3, "ppl": 30.25}}}  # fmt: skip
    (tmp_path / "g.json").write_text(json.dumps(ev))
    (tmp_path / "t.json").write_text(json.dumps({"run": {"step": 5}, "ppl": {"ppl": 16.0}}))
    table = rr.print_table(
        "paper_run", [f"gpn_m_1l={tmp_path}/g.json", f"transformer={tmp_path}/t.json"],
        str(tmp_path / "saved.json"),
    )  # fmt: skip
    lines = table.splitlines()
    assert (
        lines[2]
        == "| GPN+M (1L) | 10000 | 18.50 | 18.06 | 0.150 | 0.146 | 33.00 | 33.45 | 0.300 / 30.25 |"
    )
    assert lines[3] == "| Transformer++ | 5 | 16.00 | 16.05 | — | 0.223 | — | 18.99 | — / — |"
    saved = json.loads((tmp_path / "saved.json").read_text())
    assert rr.table("x", saved, str(tmp_path), str(tmp_path)).startswith(lines[0])

    def zero_shot(name, scores):
        rows = [{"column": c, "value": v} for c, v in scores.items()]
        (tmp_path / name).write_text(json.dumps({"label": name[:-5], "rows": rows}))
        return str(tmp_path / name)

    a = zero_shot("a.json", {"PIQA acc": 0.6, "LMB. ppl": 30.0, "local acc": 0.25})
    b = zero_shot("b.json", {"PIQA acc": 0.5})
    lines = rr.print_table("zero_shot", [a, b], None).splitlines()
    assert lines[0] == "| Model | LMB. ppl | PIQA acc | local acc |"  # the papers' order first
    assert lines[2:] == ["| a | 30.00 | 0.600 | 0.250 |", "| b | — | 0.500 | — |"]
    with pytest.raises(rr.ResultError, match="use KEY=FILE with KEY one of"):
        rr.print_table("paper_run", [f"gpn={a}"], None)


def test_axis_rules_is_a_config_field_checked_against_the_mesh_axes():
    import ml_collections

    from experiments.configs import gpn_m_1l_130m
    from gpn_jax.parallel import sharding

    c = gpn_m_1l_130m.get_config()
    assert tuple(c.mesh.axis_rules.items()) == tuple(sorted(sharding.DEFAULT_AXIS_RULES))
    c.mesh.axis_rules.heads = ""  # what --config.mesh.axis_rules.heads='' sets
    rules = sharding.rules_from_config(c.mesh)
    assert rules.mesh_axis("heads") is None and rules.mesh_axis("ffn") == "tensor"
    c.mesh.axis_rules.ffn = "model"
    with pytest.raises(ValueError, match=r"config.mesh.axis_rules.ffn='model' is not a mesh axis"):
        sharding.rules_from_config(c.mesh)
    with pytest.raises(ValueError, match="must map logical axes"):
        sharding.rules_from_config(ml_collections.ConfigDict({"axis_rules": "heads=tensor"}))


@pytest.mark.slow
def test_rehearsal_runs_the_page_end_to_end(tmp_path):
    """launch/rehearse.sh: the page's blocks on this CPU (stand-ins for gcloud, ssh, sbatch;
    2 TPU hosts joined by jax.distributed; one host preempted midway and resumed), ending
    with the evaluations and both tables; its own checks must pass."""
    env = dict(
        os.environ,
        GPN_STANDIN_XLA_FLAGS=FAST_COMPILE,  # every host compiles as the tests do
        GPN_STANDIN_JAX_CACHE_DIR=os.environ["JAX_COMPILATION_CACHE_DIR"],
    )
    r = subprocess.run(
        ["bash", "launch/rehearse.sh", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
        timeout=1500, env=env,
    )  # fmt: skip
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    assert "[rehearsal] checks passed" in r.stdout
    # the TPU topology's compile left no cache entry that a later compile fails to load
    assert "Error reading persistent compilation cache" not in r.stdout + r.stderr
    table = json.loads((tmp_path / "eval" / "paper_run.json").read_text())
    assert [row["model"] for row in table["rows"]] == [
        "GPN+M (1L)",
        "Transformer++",
        "Gated DeltaNet",
    ]
    assert all(row["ppl"] != "—" and row["lambada_acc"] != "—" for row in table["rows"])


chip_hours = _load("launch/chip_hours.py")


def test_chip_hours_recommends_the_cheapest_configuration_that_fits():
    """Issue 84: the page recommended 16 sequences per chip on v5p (15.1 chip-hours) against
    6.2 at 128, and listed v5e at 128 per chip, which does not fit. The JSON lists no
    chip-hours for a batch above a TPU's largest that compiled, and its recommendation per
    accelerator (what the page says) is the cheapest GPN+M row that fits."""
    record = json.load(open(os.path.join(ROOT, "experiments/results/chip_hours_130m.json")))
    fits = record["largest_fitting"]
    assert fits == chip_hours.largest_fitting() and set(fits) == {"v5e", "v5p"}
    for r in record["rows"]:
        for device, largest in fits.items():
            assert (r[f"{device}_chip_hours"] is None) == (r["batch_per_chip"] > largest), r
    assert record["recommended"] == chip_hours.recommended(record["rows"], fits)
    section = TEXT.split("## 9.")[1].split("\n## ")[0]
    for rec in record["recommended"]:
        assert f"on {rec['device']}, {rec['batch_per_chip']} sequences per chip" in section
        assert f"at least {rec['chip_hours']:.1f} chip-hours" in section


def test_the_recommendation_is_the_cheapest_fitting_row():
    rows = [
        {"model": "GPN+M (1L)", "batch_per_chip": b, "v5e_chip_hours": h, "v5p_chip_hours": h}
        | {"h100_chip_hours": h, "h200_chip_hours": h}
        for b, h in ((16, 50.0), (32, 30.0), (128, None))
    ]
    got = chip_hours.recommended(rows, {"v5e": 32})
    assert got == [
        {"device": "v5e", "batch_per_chip": 32, "chip_hours": 30.0, "largest_fitting": 32}
    ]


def test_the_page_gives_prepares_time_and_disk_from_the_measured_rate():
    """Issue 84: pre-tokenising the ~10B-token sample had no time or disk estimate on the page.
    Its numbers are the benchmark's (tokens/s on one worker) and 2 bytes per uint16 token."""
    bench = json.load(open(os.path.join(ROOT, "experiments/results/prepare_bench.json")))
    (one,) = [r for r in bench["rows"] if r["workers"] == 1]
    assert f"measured {one['tokens_per_s'] / 1e6:.1f} million tokens/s on one" in TEXT
    assert "about 20 GB for the sample's ~10 billion" in TEXT and 10e9 * 2 / 1e9 == 20
    hours = 10e9 / one["tokens_per_s"] / 3600
    assert "take about one core-hour at that rate" in TEXT and 0.5 < hours < 1.5
    assert "`--workers=N`" in TEXT and "workers" in absl_flags("gpn_jax.prepare")
