"""gpn_jax.export: a run's checkpoint -> a model directory -> the same model, without orbax."""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from gpn_jax.checkpoints.model_dir import load_either, tensor_sha256
from gpn_jax.checkpoints.restore import load_run
from gpn_jax.data.text_sources import embedded_corpus
from gpn_jax.data.tokenizer import train_tokenizer
from gpn_jax.eval import run_evals
from gpn_jax.export import export, load
from gpn_jax.io.errors import CheckpointError
from gpn_jax.io.files import sha256_file
from tests.helpers.training import save_tiny_run, tiny_bound

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILES = [
    ".gpn_jax-outputs.json",
    "README.md",
    "config.json",
    "model.safetensors",
    "tokenizer.model",
]
FINAL = {"heldout_ppl": 123.456, "unigram_ppl": 400.5, "heldout_tokens": 6144, "step": 3}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A gpn_m_tiny checkpoint at step 3, saved as training saves one, with final metrics."""
    wd = str(tmp_path_factory.mktemp("run"))
    save_tiny_run(wd, 3)
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
    assert record["tokenizer_sha256"] == sha256_file(os.path.join(workdir, "tokenizer.model"))
    tensors = load_file(os.path.join(exported, "model.safetensors"))
    assert "ground.fuse" in tensors and "embed" in tensors  # '.'-joined paths of the params dict
    card = open(os.path.join(exported, "README.md")).read()
    total = sum(v.size for v in tensors.values())
    assert f"parameters: {total:,}" in card
    assert "held-out PPL: 123.456 vs unigram PPL 400.500, over 6,144 held-out tokens" in card
    assert "family: `gpn` (GPN+M, Grounded Prediction Network with memory)" in card
    assert "data source: `embedded`" in card and "tokens seen: 768" in card
    assert "python -m gpn_jax.export --workdir=W --out=O" in card


def test_the_cards_python_snippet_runs_in_the_exported_directory(exported, monkeypatch, capsys):
    """Issue 84: the card suggested `from gpn_jax.export import load`, whose result has no
    `.generate`. The card's Python block, run as written in the directory, prints a sample."""
    card = open(os.path.join(exported, "README.md")).read()
    (snippet,) = re.findall(r"```python\n(.*?)```", card, re.S)
    monkeypatch.chdir(exported)
    exec(compile(snippet, "README.md", "exec"), {})
    printed = capsys.readouterr().out  # the sample: the prompt, then what the model wrote
    assert printed.startswith("The") and len(printed) > len("The\n"), printed


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
    # exp turns the mean loss's absolute error (log ppl x its relative error) into the PPL's
    rel = np.log(want["ppl"]) * tiny_bound(2 * 8 * 32)
    assert got["ppl"] == pytest.approx(want["ppl"], rel=rel)
    assert sorted(os.listdir(out)) == FILES  # evaluation wrote nothing into the model directory


def test_cli_errors_are_one_line(exported, tmp_path):
    """A model directory's error through a CLI is its one line (the other messages are checked
    in-process below; each CLI's one-line exit: test_eval_cli.py's test_missing_checkpoint,
    test_os_errors.py's test_a_file_size_limit_in_export_is_one_line)."""
    half = copy_of(exported, tmp_path)
    weights = os.path.join(half, "model.safetensors")
    open(weights, "r+b").truncate(os.path.getsize(weights) // 2)
    one_line_error(
        cli("gpn_jax.generate", f"--model_dir={half}", "--prompt=x"),
        "gpn-generate",
        f"{weights}: tensor",
    )


def test_bad_workdir_model_dir_or_out_is_one_line(exported, tmp_path):
    """What `gpn-generate`, `gpn-evaluate` and `gpn-export` report (their one line)."""
    for workdir, model_dir in ((None, None), (str(tmp_path), exported)):
        with pytest.raises(ValueError, match="^give exactly one of --workdir") as e:
            load_either(workdir, model_dir, None)
        assert "\n" not in str(e.value)
    (tmp_path / "run").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoint"):
        export(str(tmp_path / "run"), str(tmp_path / "o"))
    with pytest.raises(ValueError, match="is not a model directory: no config.json"):
        load(str(tmp_path))


# ---------------------------------------------------------------- config.json and safetensors
def _edit_config(d: str, edit) -> None:
    path = os.path.join(d, "config.json")
    record = json.load(open(path))
    record = edit(record)
    with open(path, "w") as f:
        json.dump(record, f)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda r: [], "not written by gpn_jax.export"),
        (lambda r: r | {"step": None}, "its step is None, not a non-negative integer"),
        (lambda r: r | {"step": True}, "its step is True"),
        (lambda r: r | {"config": {"data": {}}}, "lacks the run config and its model block"),
        (lambda r: r | {"config": []}, "lacks the run config and its model block"),
        (lambda r: r | {"tokenizer_file": "/etc/passwd"}, "is not a file name inside"),
        (lambda r: r | {"tokenizer_file": "../tokenizer.model"}, "is not a file name inside"),
        (lambda r: r | {"tokenizer_file": ".."}, "is not a file name inside"),
        (lambda r: r | {"tokenizer_sha256": None}, "is not a sha256"),
    ],
    ids=["list", "step_null", "step_bool", "no_model", "config_list", "absolute", "dotdot",
         "parent", "no_sha"],
)  # fmt: skip
def test_refuses_a_malformed_config_json_in_one_line(exported, tmp_path, edit, message):
    d = copy_of(exported, tmp_path)
    _edit_config(d, edit)
    with pytest.raises(ValueError) as e:
        load(d)
    text = str(e.value)
    assert text.startswith(os.path.join(d, "config.json")) and message in text, text
    assert "\n" not in text


def test_a_config_past_the_trainers_bounds_is_refused_before_anything_is_built(exported, tmp_path):
    """`n_layers=10000000` in config.json (issue 83): the trainer's bounds, one line."""
    d = copy_of(exported, tmp_path)
    _edit_config(d, lambda r: r | {"config": r["config"] | {"model": r["config"]["model"] | {
        "n_layers": 10_000_000}}})  # fmt: skip
    with pytest.raises(ValueError, match="config.model.n_layers must be at most 4096") as e:
        load(d)
    assert str(e.value).startswith(os.path.join(d, "config.json")) and "\n" not in str(e.value)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_weights_are_refused_naming_the_tensor(exported, tmp_path, bad):
    """`decode.proj` all NaN (or Inf) with every digest recomputed (issue 83): refused."""
    d = copy_of(exported, tmp_path)
    path = os.path.join(d, "model.safetensors")
    _rewrite(path, lambda t: t["decode.proj"].fill(bad))
    tensors = load_file(path)

    def redigest(r):
        r["tensor_sha256"] = {k: tensor_sha256(v) for k, v in tensors.items()}
        r["files_sha256"]["model.safetensors"] = sha256_file(path)
        return r

    _edit_config(d, redigest)
    with pytest.raises(ValueError, match="tensor 'decode.proj' holds NaN or Inf values") as e:
        load(d)
    assert str(e.value).startswith(path) and "\n" not in str(e.value)


@pytest.mark.parametrize("keep", [0, 7, 8, 100, -1000, -1])
def test_refuses_a_truncated_safetensors_in_one_line(exported, tmp_path, keep):
    """A half-copied file (cut anywhere: in the length, the header or the data) is named."""
    d = copy_of(exported, tmp_path)
    path = os.path.join(d, "model.safetensors")
    data = open(path, "rb").read()
    open(path, "wb").write(data[:keep])
    with pytest.raises(ValueError, match=r"model\.safetensors: .*(truncated|outside)") as e:
        load(d)
    assert "\n" not in str(e.value)


def test_a_huge_header_length_is_refused_before_reading(exported, tmp_path):
    d = copy_of(exported, tmp_path)
    path = os.path.join(d, "model.safetensors")
    data = bytearray(open(path, "rb").read())
    data[:8] = (2**62).to_bytes(8, "little")
    open(path, "wb").write(bytes(data))
    with pytest.raises(ValueError, match="truncated or not a safetensors file"):
        load(d)


# ---------------------------------------------------------------- --out is never clobbered
def test_export_refuses_a_foreign_non_empty_directory(workdir, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "NOTES.md").write_text("my notes")
    with pytest.raises(ValueError, match="not an earlier export of this run; .*--overwrite"):
        export(workdir, str(out))
    assert sorted(os.listdir(out)) == ["NOTES.md"] and (out / "NOTES.md").read_text() == "my notes"
    export(workdir, str(out), overwrite=True)  # adds the export's files; the user's stay
    assert sorted(os.listdir(out)) == sorted([*FILES, "NOTES.md"])
    assert (out / "NOTES.md").read_text() == "my notes"
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".mine.")]  # no temporaries left


def test_export_replaces_an_earlier_export_of_the_same_run(workdir, exported, tmp_path):
    out = copy_of(exported, tmp_path)
    os.remove(os.path.join(out, "README.md"))
    export(workdir, out)
    assert sorted(os.listdir(out)) == FILES


@pytest.mark.parametrize("where", ["workdir", "inside", "parent", "file"])
def test_export_refuses_the_run_itself_or_a_file(workdir, tmp_path, where):
    out = {
        "workdir": workdir,
        "inside": os.path.join(workdir, "export"),
        "parent": os.path.dirname(workdir),
        "file": str(tmp_path / "f"),
    }[where]
    if where == "file":
        open(out, "w").write("x")
    before = sorted(os.listdir(workdir))
    with pytest.raises(ValueError, match=r"^--out="):
        export(workdir, out, overwrite=True)
    assert sorted(os.listdir(workdir)) == before
