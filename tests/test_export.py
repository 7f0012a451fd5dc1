"""gpn_jax.export: a run's checkpoint -> a model directory -> the same model, without orbax."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from experiments.configs import gpn_m_tiny
from gpn_jax.checkpoints import model_dir as md
from gpn_jax.checkpoints.manager import Checkpointer
from gpn_jax.checkpoints.restore import load_run
from gpn_jax.data.pipeline import build_data
from gpn_jax.data.text_sources import embedded_corpus
from gpn_jax.data.tokenizer import train_tokenizer
from gpn_jax.eval import run_evals
from gpn_jax.export import export, load
from gpn_jax.models import factory
from gpn_jax.training import train_step as ts
from gpn_jax.training.optimizer import make_optimizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ["README.md", "config.json", "model.safetensors", "tokenizer.model"]
FINAL = {"heldout_ppl": 123.456, "unigram_ppl": 400.5, "heldout_tokens": 6144, "step": 3}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A gpn_m_tiny checkpoint at step 3, saved as training saves one, with final metrics."""
    c = gpn_m_tiny.get_config()
    c.train.update(dict(batch_size=8, steps=3, async_checkpoints=False))
    wd = str(tmp_path_factory.mktemp("run"))
    model = factory.build_model(c.model)
    state = ts.init_train_state(
        model, make_optimizer(c.train, model.weight_decay_mask), jax.random.PRNGKey(1)
    )
    data = build_data(c.data.source, vocab_size=512, seq_len=32, batch_size=8, workdir=wd,
                      seed=c.seed, heldout_fraction=c.data.heldout_fraction)  # fmt: skip
    with Checkpointer(wd, keep=None, async_save=False) as ckpt:
        ckpt.save(3, state, data.train.get_state(), c.to_dict(), {"step": 3}, force=True)
    with open(os.path.join(wd, "final_metrics.json"), "w") as f:
        json.dump(FINAL, f)
    return wd


@pytest.fixture(scope="module")
def exported(workdir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("export") / "model")
    export(workdir, out, command="python -m gpn_jax.export --workdir=W --out=O")
    return out


def copy_of(exported, tmp_path):
    dst = str(tmp_path / "copy")
    shutil.copytree(exported, dst)
    return dst


def test_round_trip_logits_are_identical(workdir, exported):
    ckpt, loaded = load_run(workdir), load(exported)
    assert loaded.step == ckpt.step == 3 and loaded.workdir == exported
    assert loaded.config.model.to_dict() == ckpt.config.model.to_dict()
    assert loaded.config.train.to_dict() == ckpt.config.train.to_dict()
    tokens = np.asarray([ckpt.tokenizer.encode("The interpreter reads the file and then")])
    want, _ = ckpt.model.logits(ckpt.params, tokens)
    got, _ = loaded.model.logits(loaded.params, tokens)
    # Same float32 tensors and the same program: bit-identical, no tolerance needed.
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert loaded.tokenizer.encode("a dict") == ckpt.tokenizer.encode("a dict")


def test_directory_layout_and_card(workdir, exported):
    assert sorted(os.listdir(exported)) == FILES
    record = json.load(open(os.path.join(exported, "config.json")))
    assert record["family"] == "gpn" and record["step"] == 3
    assert record["tokens_seen"] == 3 * 8 * 32
    assert record["tokenizer_sha256"] == md.file_sha256(os.path.join(workdir, "tokenizer.model"))
    tensors = load_file(os.path.join(exported, "model.safetensors"))
    assert "ground.fuse" in tensors and "embed" in tensors  # '.'-joined paths of the params dict
    card = open(os.path.join(exported, "README.md")).read()
    total = sum(v.size for v in tensors.values())
    assert f"parameters: {total:,}" in card
    assert "held-out PPL: 123.456 vs unigram PPL 400.500, over 6,144 held-out tokens" in card
    assert "family: `gpn` (GPN+M, Grounded Prediction Network with memory)" in card
    assert "data source: `embedded`" in card and "tokens seen: 768" in card
    assert "python -m gpn_jax.export --workdir=W --out=O" in card


def _rewrite(path, edit):
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.pop("decode.norm"), "missing tensor 'decode.norm'"),
        (lambda t: t.update(extra=np.zeros(2, np.float32)), "extra tensor 'extra'"),
        (
            lambda t: t.update({"ground.fuse": t["ground.fuse"].T.copy()}),
            "tensor 'ground.fuse' is float32[64, 32], the config implies float32[32, 64]",
        ),
    ],
    ids=["missing", "extra", "shape"],
)
def test_refuses_tensors_that_disagree_with_the_config(exported, tmp_path, edit, message):
    d = copy_of(exported, tmp_path)
    _rewrite(os.path.join(d, "model.safetensors"), edit)
    with pytest.raises(ValueError, match="model.safetensors disagrees with config.json") as e:
        load(d)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_refuses_another_tokenizer(exported, tmp_path):
    d = copy_of(exported, tmp_path)
    train_tokenizer(embedded_corpus()[:20], 400, os.path.join(d, "tokenizer.model"))
    with pytest.raises(ValueError, match="not the model's tokenizer"):
        load(d)


def cli(module, *args):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip


def one_line_error(proc, prog, match):
    assert proc.returncode == 1, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), proc.stderr
    assert match in lines[0], lines[0]


@pytest.mark.slow
def test_cli_export_then_generate_and_evaluate_from_the_directory(workdir, tmp_path):
    out = str(tmp_path / "m")
    proc = cli("gpn_jax.export", f"--workdir={workdir}", f"--out={out}", "--step=3")
    assert proc.returncode == 0, proc.stderr
    assert (
        f"python -m gpn_jax.export --workdir={workdir} --out={out} --step=3"
        in open(os.path.join(out, "README.md")).read()
    )
    sample = ["--prompt=The list", "--greedy", "--max_new_tokens=6"]
    from_dir = cli("gpn_jax.generate", f"--model_dir={out}", *sample)
    from_run = cli("gpn_jax.generate", f"--workdir={workdir}", *sample)
    assert from_dir.returncode == 0, from_dir.stderr
    assert from_dir.stdout == from_run.stdout and from_dir.stdout.startswith("The list")
    res = tmp_path / "r.json"
    proc = cli("gpn_jax.evaluate", f"--model_dir={out}", "--eval=ppl", "--ppl_max_batches=2",
               f"--out={res}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    want = run_evals(load_run(workdir), ["ppl"], ppl_max_batches=2)["ppl"]
    got = json.loads(res.read_text())["ppl"]
    assert got["tokens"] == want["tokens"] == 2 * 8 * 32
    # Same windows and weights; the subprocess's XLA program may differ only in float rounding:
    # measured identical here; 1e-6 relative is far below any data or weight difference.
    assert got["ppl"] == pytest.approx(want["ppl"], rel=1e-6)
    assert sorted(os.listdir(out)) == FILES  # evaluation wrote nothing into the model directory


def test_cli_errors_are_one_line(exported, tmp_path):
    one_line_error(cli("gpn_jax.generate", "--prompt=x"), "gpn-generate", "exactly one of")
    one_line_error(
        cli("gpn_jax.evaluate", f"--workdir={tmp_path}", f"--model_dir={exported}"),
        "gpn-evaluate",
        "exactly one of",
    )
    one_line_error(
        cli("gpn_jax.export", f"--workdir={tmp_path}", f"--out={tmp_path / 'o'}"),
        "gpn-export",
        "no checkpoint",
    )
    one_line_error(
        cli("gpn_jax.generate", f"--model_dir={tmp_path}", "--prompt=x"),
        "gpn-generate",
        "is not a model directory: no config.json",
    )
