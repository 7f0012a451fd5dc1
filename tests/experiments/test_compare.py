"""`experiments.compare`: one shared budget for four models, a Table-1-shaped table and a plot."""

import json
import os

import pytest

from experiments import compare
from experiments.configs import compare_130m, compare_tiny
from gpn_jax.configs import recipe
from tests.helpers.compare import run_one_device

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAMES = ["gpn_m", "gpn", "transformer", "gdn"]


def stats(config):
    return {
        n: compare.model_stats(compare.run_config(config, n).model, config.train.seq_len)
        for n in compare.model_names(config)
    }


def test_tiny_models_are_the_four_families_with_matched_parameter_counts():
    c = compare_tiny.get_config()
    assert compare.model_names(c) == NAMES
    s = stats(c)
    assert [s[n]["family"] for n in NAMES] == ["gpn", "gpn", "transformer", "gdn"]
    counts = [s[n]["params"] for n in NAMES]
    assert max(counts) / min(counts) - 1 <= 0.10, counts
    assert s["gpn_m"]["memory_cells"] == 4 * 32 * 64
    assert s["gpn"]["memory_cells"] == 0
    assert s["gdn"]["memory_cells"] == 4 * 2 * 32 * 64  # layers x heads x dk x dv


def test_run_configs_share_everything_but_the_model_block():
    c = compare_tiny.get_config()
    c.data.heldout_fraction = 0.07  # a shared override reaches every run
    runs = {n: compare.run_config(c, n, "/tok.model").to_dict() for n in NAMES}
    shared = {k: v for k, v in runs["gpn_m"].items() if k != "model"}
    for n, rc in runs.items():
        assert {k: v for k, v in rc.items() if k != "model"} == shared, n
        assert rc["data"]["tokenizer_path"] == "/tok.model"
        assert rc["data"]["heldout_fraction"] == 0.07
    assert runs["transformer"]["model"]["max_seq_len"] == c.train.seq_len
    assert set(shared) == {"seed", "data", "train", "mesh", "logging"}


def test_130m_compares_the_paper_configs_with_the_paper_recipe():
    from experiments.configs import gdn_130m, gpn_1l_130m, gpn_m_1l_130m, transformer_130m

    c = compare_130m.get_config()
    assert compare.model_names(c) == NAMES
    for name, mod in zip(
        NAMES, (gpn_m_1l_130m, gpn_1l_130m, transformer_130m, gdn_130m), strict=True
    ):
        assert c.models[name].to_dict() == mod.get_config().model.to_dict()
    assert c.train.to_dict() == recipe.base_config().train.to_dict()
    s = stats(c)
    assert s["gpn_m"]["params"] == 129_151_902
    assert s["gpn_m"]["memory_cells"] == 491_520


def test_models_must_share_one_vocabulary():
    c = compare_tiny.get_config()
    c.models.gdn.vocab_size = 4096
    with pytest.raises(ValueError, match="one vocab_size"):
        compare.check_shared(c)
    c = compare_tiny.get_config()
    c.compare.models = "gpn_m,nope"
    with pytest.raises(ValueError, match="nope"):
        compare.model_names(c)


LAMBADA_TEXTS = [
    "the cat sat on the mat and the dog sat on the mat",
    "a list is a sequence and a tuple is a sequence",
    "print the value of the variable",
]


def run_compare(workdir, lambada_path=""):
    """`compare(micro_config(), workdir)` in a fresh process with one CPU device (the tests'
    forced 8 devices would run 8 GDN programs at once in a small thread pool)."""
    code = (
        "import sys\n"
        "from experiments.compare import compare\n"
        "from tests.helpers.compare import micro_config\n"
        "compare(micro_config(), sys.argv[1], lambada_path=sys.argv[2] or None)\n"
    )
    return run_one_device(code, workdir, lambada_path)


@pytest.mark.slow
def test_micro_compare_writes_the_table_and_the_plot_then_reuses_the_runs(tmp_path):
    lambada_path = tmp_path / "lambada.jsonl"
    lambada_path.write_text("".join(json.dumps({"text": t}) + "\n" for t in LAMBADA_TEXTS))
    workdir = tmp_path / "cmp"
    proc = run_compare(workdir, lambada_path)

    # one tokenizer, trained once, used by every run
    assert (workdir / "tokenizer.model").exists()
    assert "Trained the shared tokenizer" in proc.stdout
    result = json.loads((workdir / "comparison.json").read_text())
    rows = result["rows"]
    assert [r["name"] for r in rows] == NAMES
    assert result["columns"] == list(compare.COLUMNS)
    for r in rows:
        run_cfg = json.loads((workdir / r["name"] / compare.RUN_CONFIG).read_text())
        assert run_cfg["data"]["tokenizer_path"] == str(workdir / "tokenizer.model")
        assert r["step"] == 6 and r["tokens_seen"] == 6 * 8 * 32
        assert 1 < r["heldout_ppl"] < 2 * 512
        assert (workdir / r["name"] / "final_metrics.json").exists()
    assert len({(r["heldout_tokens"], r["unigram_ppl"]) for r in rows}) == 1  # same windows

    md = (workdir / "comparison.md").read_text()
    table = [ln for ln in md.splitlines() if ln.startswith("|")]
    assert table[0] == "| " + " | ".join(compare.COLUMNS) + " |"
    body = table[2:]
    assert len(body) == 4
    assert [ln.split(" | ")[0] for ln in body] == [
        "| GPN+M",
        "| GPN",
        "| Transformer++",
        "| Gated DeltaNet",
    ]
    assert all(len(ln.strip("|").split("|")) == len(compare.COLUMNS) for ln in body)
    assert all(r["lambada_acc"] is not None and r["lambada_ppl"] > 1 for r in rows)
    assert result["lambada"]["path"] == str(lambada_path)

    png = workdir / "loss_curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # A rerun trains nothing: every finished run is reused.
    again = run_compare(workdir, lambada_path)
    assert again.stdout.count("Reusing") == 4, again.stdout
    assert (
        json.loads((workdir / "comparison.json").read_text())["rows"][0]["heldout_ppl"]
        == (rows[0]["heldout_ppl"])
    )
