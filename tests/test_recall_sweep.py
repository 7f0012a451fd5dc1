"""The MQAR sweep: matched parameter counts, best LR per cell, table + plot, bad cells."""

import json
import os

import pytest

from experiments import recall_sweep as rs
from experiments.configs import recall_sweep as sweep_config


def test_families_are_matched_to_gpn_m_parameters():
    s = sweep_config.get_config()
    counts = {f: rs.n_params(rs.model_fields(f, 128, 32, s)) for f in rs.families(s)}
    assert counts["gpn_m"] == 238_088  # the headline model (~236K; 4 memory heads)
    m = rs.model_fields("gpn_m", 128, 32, s)
    assert (m["n_heads"], m["d_key"], m["d_value"]) == (4, 16, 32)
    s.heads = 2  # H x dk and H x dv stay fixed: only the per-head gate rows change the count
    assert rs.n_params(rs.model_fields("gpn_m", 128, 32, s)) == 237_572
    for family, n in counts.items():  # d_ffn moves in steps of 8: 6,144 parameters (2.6 %) for
        assert abs(n / counts["gpn_m"] - 1) < 0.013, (family, n)  # the 2-layer GDN, half is 1.3 %


def test_bad_cells_fail_before_training(tmp_path):
    s = sweep_config.get_config("tiny")
    s.pairs = (4,)  # 4 pairs need seq_len >= 10; the tiny grid has 8
    with pytest.raises(ValueError, match="leave no room for a query"):
        rs.recall_sweep(s, str(tmp_path))
    s = sweep_config.get_config("tiny")
    s.families = "gpn_m,rnn"
    with pytest.raises(ValueError, match="unknown families"):
        rs.recall_sweep(s, str(tmp_path))


def test_tiny_sweep_keeps_the_best_lr_and_writes_outputs(tmp_path, monkeypatch):
    s = sweep_config.get_config("tiny")
    s.learning_rates = (3e-3, 1e-3)
    accs = {}  # fake accuracies per run directory: lr 1e-3 wins for gdn, 3e-3 for gpn_m

    def fake_train_one(config, workdir, heldout):
        lr = config.train.learning_rate
        fam = config.model.family
        acc = (0.5 if lr == 3e-3 else 0.25) if fam == "gpn" else (0.2 if lr == 3e-3 else 0.6)
        acc += 0.01 * config.seed
        accs[workdir] = acc
        return {"acc": acc, "acc_by_query": [acc], "chance": 0.25, "params": 1, "wall_s": 0.0}

    monkeypatch.setattr(rs, "train_one", fake_train_one)
    table = rs.recall_sweep(s, str(tmp_path), log=lambda _: None)
    assert len(accs) == 2 * 2 * 2  # families x lrs x seeds
    by = {r["family"]: r for r in table["rows"]}
    assert by["gpn_m"]["best_lr"] == 3e-3 and by["gpn_m"]["acc"] == pytest.approx(0.505)
    assert by["gdn"]["best_lr"] == 1e-3 and by["gdn"]["acc_by_seed"] == [0.6, 0.61]
    for f in (rs.TABLE_MD, rs.TABLE_JSON, rs.PLOT):
        assert os.path.getsize(tmp_path / f) > 0
    assert json.loads((tmp_path / rs.TABLE_JSON).read_text())["rows"] == table["rows"]
    assert "| 2 | 8 | 16 | GPN+M |" in (tmp_path / rs.TABLE_MD).read_text()


@pytest.mark.slow
def test_one_real_run_trains_on_fresh_answer_only_data(tmp_path):
    s = sweep_config.get_config("tiny")
    fields = rs.model_fields("gpn_m", 16, 8, s)
    config = rs.run_config(s, fields, 2, 8, 3e-3, 0)
    assert config.data.source == "recall:pairs=2,keys=4,values=4,examples=0,heldout=16"
    r = rs.train_one(config, str(tmp_path / "run"), s.heldout)
    assert 0.0 <= r["acc"] <= 1.0 and len(r["acc_by_query"]) == 2 and r["chance"] == 0.25
    assert rs.train_one(config, str(tmp_path / "run"), s.heldout) == r  # reused, not retrained


def test_report_only_tabulates_finished_runs(tmp_path, monkeypatch):
    s = sweep_config.get_config("tiny")
    s.report_only = True
    calls = []
    monkeypatch.setattr(rs, "train_one", lambda *a: calls.append(a) or {})
    assert rs.recall_sweep(s, str(tmp_path), log=lambda _: None)["rows"] == []
    done = tmp_path / "p2_t8_w16" / "gdn" / "lr0.003_s1"
    done.mkdir(parents=True)
    (done / rs.RESULT).write_text(json.dumps({"acc": 0.7, "wall_s": 1.0}))
    monkeypatch.setattr(
        rs, "train_one", lambda c, wd, h: json.load(open(os.path.join(wd, rs.RESULT)))
    )
    (row,) = rs.recall_sweep(s, str(tmp_path), log=lambda _: None)["rows"]
    assert row["family"] == "gdn" and row["acc_by_seed"] == [0.7] and not calls


def test_compute_floor_counts_the_grid_and_times_every_family(capsys):
    """`experiments.recall_floor`: one timed step per family and cell; the grid's FLOPs are
    every run's steps x the model's own per-step count, and the floor is FLOPs / peak."""
    from experiments import recall_floor

    s = sweep_config.get_config("tiny")
    s.learning_rates = (3e-3, 1e-3)  # 2 lrs x 2 seeds: 4 runs per family and cell
    out = recall_floor.floor(s, steps=1, repeats=1, peak=1e9)
    assert [r["family"] for r in out["rows"]] == ["gpn_m", "gdn"]
    assert all(r["step_s"] > 0 for r in out["rows"])
    expected = 0.0
    for family in ("gpn_m", "gdn"):
        fields = rs.model_fields(family, 16, 8, s)
        per_token = rs.factory.build_model(fields).flops_per_token(8)["train"]
        expected += per_token * s.batch_size * 8 * s.steps * 4
    assert out["total_flops"] == pytest.approx(expected, rel=1e-12)
    assert out["floor_s"] == pytest.approx(expected / 1e9, rel=1e-12)
    assert "GFLOP/step" in capsys.readouterr().out
