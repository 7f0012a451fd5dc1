"""compare_small's infrastructure: the registry corpus's conversion, --seeds aggregation, the
overfitting gap, the claims section, and the config's matched sizes and sub-epoch budget."""

import json
import os
import subprocess
import sys

import pytest

from experiments import compare, compare_claims, compare_seeds, fetch_corpus, window_ppl
from experiments.configs import compare_small
from gpn_jax.data.text_sources import embedded_corpus
from tests.helpers.compare import run_one_device

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES = "usr/share/doc/python3.11/html/_sources"


# ------------------------------------------------------------------------------ corpus
def fake_deb_tree(root, docs: dict) -> None:
    """An extracted python3.11-doc tree: `docs` {relative path: text} under _sources, plus the
    package's second name for the same folder (a symlink) and files that are not sources."""
    base = root / SOURCES
    for rel, text in docs.items():
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text(text, encoding="utf-8")
    (base / "notes.txt").write_text("not a source")
    (base.parent / "index.html").write_text("<html></html>")
    (root / "usr/share/doc/python3.11-doc").mkdir(parents=True)
    (root / "usr/share/doc/python3.11-doc/html").symlink_to("../python3.11/html")


def test_convert_writes_every_source_once_in_sorted_order(tmp_path):
    docs = {
        "tutorial/intro.rst.txt": "An informal introduction — Python's ``print``.\n",
        "about.rst.txt": "About these documents.\n",
        "library/os.rst.txt": "Miscellaneous operating system interfaces.\n",
        "library/empty.rst.txt": "  \n",
    }
    fake_deb_tree(tmp_path / "x", docs)
    info = fetch_corpus.convert(str(tmp_path / "x"), str(tmp_path / "out"), {"package": "p"})
    lines = (tmp_path / "out" / fetch_corpus.CORPUS_FILE).read_text("utf-8").splitlines()
    rows = [json.loads(ln) for ln in lines]
    assert [r["path"] for r in rows] == [
        "python3.11/about.rst.txt",
        "python3.11/library/os.rst.txt",
        "python3.11/tutorial/intro.rst.txt",
    ]  # sorted, the symlinked copy not doubled, empty and non-source files skipped
    assert [r["text"] for r in rows] == [docs[r["path"].split("/", 1)[1]] for r in rows]
    saved = json.loads((tmp_path / "out" / fetch_corpus.SOURCE_FILE).read_text())
    assert saved == info
    assert info["package"] == "p" and info["documents"] == 3
    assert info["text_bytes"] == sum(len(r["text"].encode()) for r in rows)


def test_two_packages_make_one_corpus_in_folder_order(tmp_path):
    fake_deb_tree(tmp_path / "x", {"b.rst.txt": "Python b.\n", "a.rst.txt": "Python a.\n"})
    kernel = tmp_path / "x/usr/share/doc/linux-doc-6.1/html/_sources"
    (kernel / "PCI").mkdir(parents=True)
    (kernel / "PCI/pci.rst.txt").write_text("How to write Linux PCI drivers.\n")
    (kernel / "index.rst.txt").write_text("The Linux kernel documentation.\n")
    fetch_corpus.convert(str(tmp_path / "x"), str(tmp_path / "out"))
    lines = (tmp_path / "out" / fetch_corpus.CORPUS_FILE).read_text("utf-8").splitlines()
    assert [json.loads(ln)["path"] for ln in lines] == [
        "linux-doc-6.1/PCI/pci.rst.txt",
        "linux-doc-6.1/index.rst.txt",
        "python3.11/a.rst.txt",
        "python3.11/b.rst.txt",
    ]


def test_files_are_cut_into_pieces_at_paragraph_breaks(tmp_path):
    a, b, c = "First para.\n\n", "Second, longer paragraph.\n\n", "\n" + "x" * 30 + "\n"
    assert fetch_corpus.pieces(a + b + c, 0) == [a + b + c]
    assert fetch_corpus.pieces(a + b + c, 40) == [
        a + b,
        c,
    ]  # 13 + 27 fit, + 32 does not (a blank line stays with what follows)
    assert fetch_corpus.pieces(a + b + c, 20) == [a, b, c]  # a longer paragraph stands alone
    assert fetch_corpus.pieces(a + "  \n", 12) == [a + "  \n"]  # trailing blanks stay attached
    fake_deb_tree(tmp_path / "x", {"one.rst.txt": a + b + c, "two.rst.txt": c})
    info = fetch_corpus.convert(str(tmp_path / "x"), str(tmp_path / "out"), piece_chars=40)
    lines = (tmp_path / "out" / fetch_corpus.CORPUS_FILE).read_text("utf-8").splitlines()
    rows = [json.loads(ln) for ln in lines]
    assert [(r["path"], r["part"], r["text"]) for r in rows] == [
        ("python3.11/one.rst.txt", 0, a + b), ("python3.11/one.rst.txt", 1, c),
        ("python3.11/two.rst.txt", 0, c),
    ]  # fmt: skip
    assert (info["files"], info["documents"], info["piece_chars"]) == (2, 3, 40)


def test_window_ppl_reads_seen_steps_spread_and_the_next_unseen_ones():
    assert window_ppl.seen_and_unseen_steps(270, 764, 4) == {
        "seen": [0, 67, 135, 202], "unseen": [270, 271, 272, 273]
    }  # fmt: skip
    with pytest.raises(ValueError, match=r"^--batches must be in \[1, 6\] \(the run trained 6"):
        window_ppl.seen_and_unseen_steps(6, 100, 7)
    with pytest.raises(ValueError, match=r"trained 760 of the 764 steps .* fewer than 5 unseen"):
        window_ppl.seen_and_unseen_steps(760, 764, 5)


def test_a_tree_without_sources_or_no_packages_is_a_one_line_error(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(ValueError, match=r"^no usr/share/doc/\*/html/_sources folder under "):
        fetch_corpus.convert(str(tmp_path / "x"), str(tmp_path / "out"))
    with pytest.raises(ValueError, match=r"^--packages is empty"):
        fetch_corpus.fetch(str(tmp_path / "out"), packages=[])


def test_missing_apt_get_and_a_failed_download_are_one_line_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="^apt-get not found"):
        fetch_corpus.download_deb("python3.11-doc", str(tmp_path))
    fake = tmp_path / "bin" / "apt-get"  # an apt-get that fails as the real one does offline
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'E: Unable to locate package '$2 >&2\nexit 100\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    with pytest.raises(ValueError) as e:
        fetch_corpus.download_deb("nope-doc", str(tmp_path))
    assert str(e.value).startswith(
        "apt-get download nope-doc failed (E: Unable to locate package nope-doc)"
    )
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_converted_corpus_prepares_into_bin_shards(tmp_path):
    """The documented second step, `python -m gpn_jax.prepare`, on a converted fake tree."""
    topics = embedded_corpus()
    docs = {f"library/m{i:03d}.rst.txt": topics[i % len(topics)] for i in range(60)}
    fake_deb_tree(tmp_path / "x", docs)
    fetch_corpus.convert(str(tmp_path / "x"), str(tmp_path / "corpus"))
    cmd = [sys.executable, "-m", "gpn_jax.prepare", "--workers=1", "--progress=false",
           f"--input={tmp_path / 'corpus' / fetch_corpus.CORPUS_FILE}",
           f"--output={tmp_path / 'bin'}", "--vocab_size=400", "--heldout_fraction=0.1"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((tmp_path / "bin" / "manifest.json").read_text())
    assert manifest["tokenizer"]["vocab_size"] == 400
    assert os.listdir(tmp_path / "bin" / "train") and os.listdir(tmp_path / "bin" / "heldout")


# ------------------------------------------------------------------------------ seeds
def test_mean_and_sample_std_are_exact_on_known_numbers():
    assert compare_seeds.mean_std([10.0, 12.0, 14.0]) == (12.0, 2.0)  # ddof = 1
    assert compare_seeds.mean_std([3.0, None, 5.0]) == (4.0, 2**0.5)
    assert compare_seeds.mean_std([7.5]) == (7.5, None)
    assert compare_seeds.mean_std([]) == (None, None)
    assert compare_seeds.pm(12.0, 2.0) == "12.00 ± 2.00"
    assert compare_seeds.pm(7.5, None) == "7.50"
    assert compare_seeds.pm(0.125, 0.025, "+.1%") == "+12.5% ± 2.5%"


def seed_runs(heldout, train):
    return [
        {"seed": s, "heldout_ppl": h, "train_ppl": t, "gap": compare_seeds.overfit_gap(h, t)}
        for s, (h, t) in enumerate(zip(heldout, train, strict=True))
    ]


def test_aggregate_and_the_overfit_gap_on_known_runs():
    assert compare_seeds.overfit_gap(21.0, 20.0) == 21.0 / 20.0 - 1
    assert compare_seeds.overfit_gap(21.0, None) is None
    row = {"label": "GPN", "runs": seed_runs([20.0, 22.0, 24.0], [20.0, 22.0, 20.0])}
    agg = compare_seeds.aggregate(row)
    assert (agg["heldout_ppl"], agg["heldout_ppl_std"]) == (22.0, 2.0)
    assert agg["train_ppl"] == pytest.approx(62.0 / 3, rel=4 * 2.0**-52)  # float64, 3 terms
    assert agg["max_abs_gap"] == 24.0 / 20.0 - 1  # the third seed: +20 %
    assert agg["seeds"] == [0, 1, 2]
    warn = compare_seeds.gap_warnings([row | agg])
    assert warn == [
        "WARNING: GPN overfits: held-out PPL 24.00 vs train PPL 20.00 (gap +20.0%, seed 2) "
        "exceeds ±5%"
    ]
    fine = {"label": "T", "runs": seed_runs([20.0, 20.9], [20.0, 20.0])}
    assert compare_seeds.gap_warnings([fine | compare_seeds.aggregate(fine)]) == []
    under = {"label": "G", "runs": seed_runs([20.0], [22.0])}
    (line,) = compare_seeds.gap_warnings([under | compare_seeds.aggregate(under)])
    assert "G scores worse on its training split" in line and "gap -9.1%" in line


def test_seed_count_and_run_dirs():
    c = compare_small.get_config()
    assert compare_seeds.seed_count(c) == 3 and compare_seeds.seed_count(c, 1) == 1
    with pytest.raises(ValueError, match="--seeds must be >= 1, got 0"):
        compare_seeds.seed_count(c, 0)
    assert compare_seeds.run_dir("/w", "gpn", 0, 1) == "/w/gpn"  # one seed: today's layout
    assert compare_seeds.run_dir("/w", "gpn", 2, 3) == "/w/gpn/s2"
    rc = compare.run_config(c, "gpn", "", seed=7)
    assert rc.seed == 7 and compare.run_config(c, "gpn").seed == c.seed


# ------------------------------------------------------------------------------ claims
def claim_rows():
    def analysis(fast, slow, mean_r, rand_r):
        return {"n_fast": fast, "n_slow": slow, "lag_1e": [1.0] * fast + [None] * slow,
                "mean_dir_ratio": mean_r, "random_dir_ratio": rand_r}  # fmt: skip

    gpn_m = {"label": "GPN+M", "family": "gpn", "memory_cells": 8, "heldout_ppl": 20.0,
             "heldout_ppl_std": 1.0, "runs": [
                 {"seed": 0, "heldout_ppl": 19.0, "analysis": analysis(1, 3, 1.5, 1.01)},
                 {"seed": 1, "heldout_ppl": 21.0, "analysis": analysis(2, 2, 1.25, 1.03)}]}  # fmt: skip
    gpn = {"label": "GPN", "family": "gpn", "memory_cells": 0, "heldout_ppl": 20.5,
           "heldout_ppl_std": 0.5, "runs": [
               {"seed": 0, "heldout_ppl": 20.0, "analysis": analysis(0, 0, 1.0, 1.1)},
               {"seed": 1, "heldout_ppl": 21.0, "analysis": analysis(0, 0, 1.2, 1.1)}]}  # fmt: skip
    tf = {"label": "T", "family": "transformer", "memory_cells": 4, "heldout_ppl": 9.0, "runs": []}
    return [gpn_m, gpn, tf]


def test_claims_on_known_numbers():
    c = compare_claims.claims(claim_rows())
    assert c["gpn_m_below_gpn"] == {
        "holds": True,
        "gpn_m": [20.0, 1.0],
        "gpn": [20.5, 0.5],
        "seeds_won": 1,
        "seeds": 2,
        "within_spread": True,
    }  # fmt: skip  (0.5 apart, std 1.0)
    assert c["head_pools"]["holds"] is True
    assert [p["n_fast"] for p in c["head_pools"]["per_seed"]] == [1, 2]
    abl = c["mean_direction_ablation"]
    assert set(abl) == {"GPN+M", "GPN"}
    assert abl["GPN+M"]["holds"] is True and abl["GPN"]["holds"] is False  # 1.0 < 1.1 in seed 0
    assert abl["GPN+M"]["mean_dir_ratio"] == [1.375, compare_seeds.mean_std([1.5, 1.25])[1]]
    md = compare_claims.markdown(c)
    assert (
        "- GPN+M below GPN in held-out PPL: **yes** — GPN+M 20.00 ± 1.00 vs GPN 20.50 ± 0.50" in md
    )
    assert "(GPN+M lower in 1 of 2 seeds; the difference is smaller than a seed std)." in md
    assert "seed 0: 1 fast / 3 slow, 1/e lags 1.0, censored, censored, censored" in md
    assert "- GPN: projecting out s̄ hurts more than a random direction: **no**" in md


# ------------------------------------------------------------------------------ config
def test_compare_small_models_are_matched_and_the_budget_stays_under_one_epoch():
    c = compare_small.get_config("/data/pd")
    assert c.data.source == "bin:/data/pd"
    default = compare_small.get_config().data.source
    assert default.startswith("bin:") and not default.startswith("bin:/tmp/")
    assert default.endswith(os.path.join("gpn_jax", "docs_strat"))
    assert compare.model_names(c) == ["gpn_m", "gpn", "transformer", "gdn"]
    counts = {
        n: compare.model_stats(compare.run_config(c, n).model, c.train.seq_len)["params"]
        for n in compare.model_names(c)
    }
    assert counts == {
        "gpn_m": 2_977_224,
        "gpn": 2_972_000,
        "transformer": 3_000_384,
        "gdn": 3_014_174,
    }  # fmt: skip  (the docstring's numbers)
    assert max(counts.values()) / min(counts.values()) - 1 < 0.015
    tokens = c.train.steps * c.train.batch_size * c.train.seq_len
    assert tokens < compare_small.TRAIN_TOKENS  # less than one epoch of the prepared corpus
    assert c.compare.seeds == 3 and c.compare.analyze


# ------------------------------------------------------------------------------ end to end
def run_two_model_compare(workdir):
    """A 2-model (GPN+M, GPN), 2-seed micro compare with the analyses, in a fresh process
    with one CPU device (as tests/experiments/test_compare.py runs it)."""
    code = (
        "import sys\n"
        "from experiments.compare import compare\n"
        "from tests.helpers.compare import micro_config\n"
        "c = micro_config()\n"
        "c.compare.models = 'gpn_m,gpn'\n"
        "c.compare.analyze = True\n"
        "c.compare.analysis_batches = 1\n"
        "compare(c, sys.argv[1], seeds=2)\n"
    )
    return run_one_device(code, workdir)


@pytest.mark.slow
def test_two_model_two_seed_compare_reports_mean_std_gap_and_claims(tmp_path):
    workdir = tmp_path / "cmp"
    run_two_model_compare(workdir)
    result = json.loads((workdir / "comparison.json").read_text())
    assert result["seeds"] == 2
    rows = result["rows"]
    assert [r["name"] for r in rows] == ["gpn_m", "gpn"]
    for r in rows:
        assert [x["workdir"] for x in r["runs"]] == [str(workdir / r["name"] / f"s{k}")
                                                      for k in range(2)]  # fmt: skip
        assert [x["seed"] for x in r["runs"]] == [0, 1]
        per_seed = [x["heldout_ppl"] for x in r["runs"]]
        assert per_seed[0] != per_seed[1]  # different seeds, different runs
        assert (r["heldout_ppl"], r["heldout_ppl_std"]) == compare_seeds.mean_std(per_seed)
        for x in r["runs"]:
            assert x["gap"] == x["heldout_ppl"] / x["train_ppl"] - 1
            assert x["unigram_gap"] == x["unigram_ppl"] / x["train_unigram_ppl"] - 1
            assert x["train_eval_tokens"] == x["heldout_tokens"]  # 45 batches of 8 x 32
            saved = json.loads((workdir / "analysis" / r["name"] / f"s{x['seed']}" /
                                "metrics.json").read_text())  # fmt: skip
            assert x["analysis"] == compare_claims.run_summary(saved)
    split = window_ppl.window_ppl(rows[0]["runs"][0]["workdir"], batches=3)
    assert split["step"] == 6 and split["seen_tokens"] == split["unseen_tokens"] == 3 * 8 * 32
    assert split["heldout_tokens"] == 3 * 8 * 32
    assert split["memorisation"] == split["unseen_ppl"] / split["seen_ppl"] - 1
    assert split["heldout_shift"] == split["heldout_ppl"] / split["unseen_ppl"] - 1
    claims = result["claims"]
    assert claims == compare_claims.claims(rows)
    m, g = rows
    assert claims["gpn_m_below_gpn"]["holds"] == (m["heldout_ppl"] < g["heldout_ppl"])
    pools = claims["head_pools"]["per_seed"]
    assert [p["n_fast"] + p["n_slow"] for p in pools] == [2, 2]  # micro GPN+M has 2 heads
    md = (workdir / "comparison.md").read_text()
    assert compare_claims.markdown(claims) in md
    assert (
        "| Held-out / train - 1 | Same, unigram |" in md
        and "mean ± sample std over 2 seed(s)" in md
    )
