"""End to end on a tiny run's workdir: held-out PPL, the CLIs, one-line errors."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from gpn_jax.checkpoints.restore import load_run
from gpn_jax.data.pipeline import build_data
from gpn_jax.data.text_sources import embedded_corpus
from gpn_jax.data.tokenizer import train_tokenizer
from gpn_jax.eval import run_evals, suite
from tests.helpers.training import tiny_bound, train_on_one_device
from tests.helpers.training import tiny_two_step_config as tiny_config

TEXTS = [
    "The interpreter reads the file and then executes every statement",
    "A dictionary maps hashable keys to arbitrary values",
    "Generators return an iterator",
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A gpn_m_tiny run trained for two steps by the trainer (checkpoint, tokenizer, final
    metrics): the run every test here evaluates."""
    wd = str(tmp_path_factory.mktemp("run"))
    train_on_one_device(tiny_config(), wd)
    return wd


@pytest.fixture(scope="module")
def run(workdir):
    """The trained run restored once (the evaluations only read it)."""
    return load_run(workdir)


@pytest.fixture(scope="module")
def lambada_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("lambada") / "lambada.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    return str(path)


def cli(module, *args):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, env=env, timeout=300
    )


def one_line_error(proc, match):
    assert proc.returncode != 0, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert match in lines[0], lines[0]


def test_heldout_ppl_is_exp_mean_loss_over_trainings_heldout_windows(workdir, run):
    r = run_evals(run, ["ppl"], ppl_max_batches=3)["ppl"]
    c = tiny_config()
    data = build_data(c.data.source, vocab_size=512, seq_len=32, batch_size=8, workdir=workdir)
    loss = jax.jit(lambda p, x: run.model.loss(p, x)[0])
    batches = list(data.heldout_windows())[:3]
    expected = np.mean([float(loss(run.params, b)) for b in batches])
    # another program over the same 3 batches of 8 x 32: exp turns the mean loss's absolute
    # error (its size x its relative error) into the PPL's relative error
    rel = expected * tiny_bound(8 * 32)
    assert r["tokens"] == 3 * 8 * 32 and r["ppl"] == pytest.approx(np.exp(expected), rel=rel)


@pytest.mark.slow
def test_heldout_ppl_equals_the_trainers_final_number(workdir, run):
    with open(os.path.join(workdir, "final_metrics.json")) as f:
        final = json.load(f)
    r = run_evals(run, ["ppl"])["ppl"]
    assert r["tokens"] == final["heldout_tokens"]
    rel = np.log(final["heldout_ppl"]) * tiny_bound(final["heldout_tokens"])  # as above
    assert r["ppl"] == pytest.approx(final["heldout_ppl"], rel=rel)


def test_evaluate_cli_writes_nested_json(workdir, lambada_file, tmp_path):
    out = tmp_path / "out.json"
    proc = cli(
        "gpn_jax.evaluate",
        f"--workdir={workdir}",
        "--eval=ppl,lambada,stream,recall",
        f"--lambada_path={lambada_file}",
        f"--out={out}",
        "--stream_buckets=0,256,1k",
        "--batch_size=4",
        "--recall_examples=8",
    )
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())
    assert set(r) == {"run", "ppl", "lambada", "stream", "recall"} and r["run"]["step"] == 2
    assert set(r["lambada"]["paper"]) == set(r["lambada"]["harness"]) == {"acc", "ppl"}
    assert r["lambada"]["n"] == 3
    assert list(r["stream"]["buckets"]) == ["0-256", "256-1k"] and r["stream"]["mode"] == "carried"
    assert r["recall"]["examples"] == 8
    assert not os.path.exists(os.path.join(workdir, "eval_results.json"))  # --out only
    assert "held-out PPL" in proc.stdout and "harness acc / PPL" in proc.stdout


def test_generate_cli(workdir):
    proc = cli("gpn_jax.generate", f"--workdir={workdir}", "--prompt=The list", "--greedy",
               "--max_new_tokens=5")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("The list")


def test_missing_checkpoint(tmp_path):
    one_line_error(cli("gpn_jax.evaluate", f"--workdir={tmp_path}"), "no checkpoint")
    one_line_error(cli("gpn_jax.generate", f"--workdir={tmp_path}", "--prompt=x"), "no checkpoint")


def test_bad_out_fails_before_loading_anything(tmp_path):
    """Issue 45 items 4 and 7: `--out=<existing directory>` (or a path under a file) failed only
    after the whole evaluation. The workdir here has no checkpoint, so an error about --out
    (not "no checkpoint") shows the check runs before the run is loaded."""
    blocker = tmp_path / "a_file"
    blocker.write_text("keep me")
    for out, match in (
        (tmp_path, "is a directory; give a file path"),
        (blocker / "r.json", "is a file, not a directory"),
    ):
        proc = cli("gpn_jax.evaluate", f"--workdir={tmp_path / 'run'}", f"--out={out}")
        one_line_error(proc, f"gpn-evaluate: error: --out={out}")
        assert match in proc.stderr
    proc = cli("gpn_jax.analyze", f"--workdir={tmp_path / 'run'}", f"--out={blocker}")
    one_line_error(proc, f"gpn-analyze: error: --out={blocker} is a file, not a directory")
    assert blocker.read_text() == "keep me"


def test_out_never_replaces_what_the_user_has(workdir, run, tmp_path):
    """An existing `--out` is refused before the evaluation unless it holds this run's results
    at this step (then evals run one at a time accumulate in it); `--out` inside the run's
    workdir is refused too. The refusals go through the CLI; the accumulating evaluations run
    in-process, as `gpn_jax.evaluate` calls the suite (its CLI writing --out: above)."""
    notes = tmp_path / "notes.json"
    notes.write_text("keep me")
    proc = cli("gpn_jax.evaluate", f"--workdir={workdir}", "--eval=ppl", f"--out={notes}")
    one_line_error(proc, f"--out={notes} exists and is not this run's results at step 2")
    assert notes.read_text() == "keep me"
    inside = os.path.join(workdir, "r.json")
    proc = cli("gpn_jax.evaluate", f"--workdir={workdir}", "--eval=ppl", f"--out={inside}")
    one_line_error(proc, f"--out={inside} is inside the run's workdir")
    assert not os.path.exists(inside)
    out = str(tmp_path / "r.json")
    for evals in ("ppl", "recall"):
        suite.check_results_file(out, run.workdir, int(run.step))  # what the CLI checks first
        results = run_evals(run, [evals], batch_size=4, recall_examples=8, ppl_max_batches=1)
        suite.write_results(results, out)
    with open(out) as f:
        assert {"run", "ppl", "recall"} <= set(json.load(f))


def test_bad_lambada_file(workdir, tmp_path):
    """Through the CLI, one malformed file; every malformed file's message (an empty one too):
    tests/eval/test_eval_lambada.py's test_malformed_files_name_the_line."""
    path = tmp_path / "l.jsonl"
    path.write_text('{"text": "a b"}\n{"text": "c d\n')
    one_line_error(
        cli("gpn_jax.evaluate", f"--workdir={workdir}", "--eval=lambada", f"--lambada_path={path}"),
        "line 2: not valid JSON",
    )


def test_tokenizer_mismatch(workdir, lambada_file, tmp_path):
    other = str(tmp_path / "other.model")
    train_tokenizer(embedded_corpus()[:20], 400, other)
    proc = cli("gpn_jax.evaluate", f"--workdir={workdir}", "--eval=lambada",
               f"--lambada_path={lambada_file}", f"--tokenizer_path={other}")  # fmt: skip
    one_line_error(proc, "tokenizer vocab 400 != model vocab_size 512")
