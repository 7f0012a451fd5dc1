"""The MQAR sweep: matched parameter counts, best LR per cell, table + plot, bad cells."""

import json
import os

import pytest

from experiments import recall_sweep as rs
from experiments.configs import recall_sweep as sweep_config
from gpn_jax.models import factory


def test_families_are_matched_to_gpn_m_parameters():
    s = sweep_config.get_config()
    counts = {f: factory.n_params(rs.model_fields(f, 128, 32, s)) for f in rs.families(s)}
    assert counts["gpn_m"] == 238_088  # the headline model (~236K; 4 memory heads)
    m = rs.model_fields("gpn_m", 128, 32, s)
    assert (m["n_heads"], m["d_key"], m["d_value"]) == (4, 16, 32)
    s.heads = 2  # H x dk and H x dv stay fixed: only the per-head gate rows change the count
    assert factory.n_params(rs.model_fields("gpn_m", 128, 32, s)) == 237_572
    for family, n in counts.items():  # d_ffn moves in steps of 8: 6,144 parameters (2.6 %) for
        assert abs(n / counts["gpn_m"] - 1) < 0.013, (family, n)  # the 2-layer GDN, half is 1.3 %


def test_bad_cells_fail_before_training(tmp_path):
    s = sweep_config.get_config("tiny")
    s.pairs = (4,)  # 4 pairs need seq_len >= 10; the tiny grid has 8
    with pytest.raises(ValueError, match="leave no room for a query"):
        rs.recall_sweep(s, str(tmp_path))
    s = sweep_config.get_config("tiny")
    s.families = "gpn_m,rnn"
    with pytest.raises(ValueError, match="unknown models"):
        rs.recall_sweep(s, str(tmp_path))


def test_tiny_sweep_keeps_the_best_lr_and_writes_outputs(tmp_path, monkeypatch):
    s = sweep_config.get_config("tiny")
    s.learning_rates = (3e-3, 1e-3)
    s.workers = 1  # in this process, where the fake below stands in for training
    accs = {}  # fake accuracies per run directory: lr 1e-3 wins for gdn, 3e-3 for gpn_m

    def fake_train_one(config, workdir, heldout):
        lr = config.train.learning_rate
        fam = config.model.family
        acc = (0.5 if lr == 3e-3 else 0.25) if fam == "gpn" else (0.2 if lr == 3e-3 else 0.6)
        acc += 0.01 * config.seed
        accs[workdir] = acc
        result = {"acc": acc, "acc_by_query": [acc], "chance": 0.25, "params": 1, "wall_s": 0.0}
        os.makedirs(workdir)
        with open(os.path.join(workdir, rs.RESULT), "w") as f:
            json.dump(result, f)
        return result

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


@pytest.mark.slow
@pytest.mark.usefixtures("all_cores")  # a worker per core: the session's cores, not this worker's
def test_runs_train_side_by_side_one_core_each(tmp_path):
    """Two workers (`gpn_jax.parallel.core_pool`): every run trains in a process pinned to one
    core, the table holds every run, and a rerun trains nothing."""
    s = sweep_config.get_config("tiny")
    s.families, s.workers = "gpn_m", 2
    cpus = sorted(rs.core_pool.usable_cpus())
    if len(cpus) < 2:
        pytest.skip("needs 2 CPU cores")
    logs = []
    (row,) = rs.recall_sweep(s, str(tmp_path), log=logs.append)["rows"]
    assert logs[0] == "2 runs to train, 2 at a time" and len(logs) == 3
    assert len(row["acc_by_seed"]) == 2
    ran_on = [rs.read_result(rs.run_dir(str(tmp_path), (2, 8, 16), "gpn_m", 3e-3, seed))["cpus"]
              for seed in (0, 1)]  # fmt: skip
    assert all(len(c) == 1 and c[0] in cpus for c in ran_on)  # a worker's one core
    logs.clear()
    assert rs.recall_sweep(s, str(tmp_path), log=logs.append)["rows"] == [row] and not logs


def test_compute_floor_counts_the_grid_and_times_every_family(capsys):
    """`experiments.recall_floor`: one timed step per family and cell; the grid's FLOPs are
    every run's steps x the model's own per-step count, and the floor is FLOPs / peak."""
    from experiments import recall_floor

    s = sweep_config.get_config("tiny")
    s.learning_rates = (3e-3, 1e-3)  # 2 lrs x 2 seeds: 4 runs per family and cell
    s.workers = 1  # timed in this process
    out = recall_floor.floor(s, steps=1, repeats=1, peak=1e9)
    assert [r["family"] for r in out["rows"]] == ["gpn_m", "gdn"]
    assert all(r["step_s"] > 0 for r in out["rows"])
    expected = 0.0
    for family in ("gpn_m", "gdn"):
        fields = rs.model_fields(family, 16, 8, s)
        per_token = rs.factory.build_model(fields).flops_per_token(8)["train"]
        expected += per_token * s.batch_size * 8 * s.steps * 4
    # float64 sums of a few exact products: 1e-12 is thousands of float64 eps (2.2e-16)
    assert out["total_flops"] == pytest.approx(expected, rel=1e-12)
    assert out["floor_s"] == pytest.approx(expected / 1e9, rel=1e-12)
    assert "GFLOP/step" in capsys.readouterr().out


def test_pool_workers_share_one_compilation_cache(tmp_path):
    """`worker_setup` points JAX's persistent cache at the sweep's directory, so a program
    compiled by one run is read back by the next; a cache the user set wins. Run in a fresh
    interpreter: JAX's cache settings are per process."""
    import subprocess
    import sys

    code = (
        "import sys, jax, jax.numpy as jnp\n"
        "from experiments import recall_sweep as rs\n"
        "rs.worker_setup(sys.argv[1])\n"
        "jax.jit(lambda x: jnp.sin(x) @ x.T)(jnp.ones((8, 8))).block_until_ready()\n"
        "print(jax.config.jax_compilation_cache_dir)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    # the checkout's root: experiments/ lives here
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cache = tmp_path / "shared"
    out = subprocess.run([sys.executable, "-c", code, str(cache)], env=env, check=True,
                         capture_output=True, text=True, cwd=root)  # fmt: skip
    assert out.stdout.strip() == str(cache) and os.listdir(cache)  # the program was written
    env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "users")
    out = subprocess.run([sys.executable, "-c", code, str(cache) + "_unused"], env=env,
                         check=True, capture_output=True, text=True, cwd=root)  # fmt: skip
    assert out.stdout.strip() == str(tmp_path / "users")
    assert not os.path.exists(str(cache) + "_unused")


@pytest.mark.slow
@pytest.mark.usefixtures("all_cores")
def test_compute_floor_times_steps_side_by_side_with_the_sweeps_workers():
    """With 2 workers each step is timed in 2 single-core processes at once, and the grid's
    stepping time is the runs' time over 2."""
    from experiments import recall_floor

    if len(rs.core_pool.usable_cpus()) < 2:
        pytest.skip("needs 2 CPU cores")
    s = sweep_config.get_config("tiny")
    s.families, s.workers = "gpn_m", 2
    out = recall_floor.floor(s, steps=1, repeats=1, peak=1e9)
    (row,) = out["rows"]
    assert out["workers"] == 2 and row["step_s"] > 0
    runs = len(s.learning_rates) * len(s.seeds)
    assert out["steps_s"] == pytest.approx(row["step_s"] * s.steps * runs / 2, rel=1e-12)
