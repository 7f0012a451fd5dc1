"""lm-evaluation-harness model: offline custom tasks checked against direct `token_losses`."""

import functools
import json
import math
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local task files only
import lm_eval  # noqa: E402  (installed by [dev], like every test import)
from lm_eval.tasks import TaskManager  # noqa: E402

from experiments.configs import gdn_tiny, gpn_m_tiny, transformer_tiny  # noqa: E402
from gpn_jax import harness  # noqa: E402
from gpn_jax.checkpoints.manager import Checkpointer  # noqa: E402
from gpn_jax.data.text_sources import embedded_corpus  # noqa: E402
from gpn_jax.data.tokenizer import train_tokenizer  # noqa: E402
from gpn_jax.eval import (  # noqa: E402
    harness_run,  # noqa: E402
    lambada,
    sampling,
)
from gpn_jax.eval.harness_lm import GPNLM  # noqa: E402
from gpn_jax.models import factory  # noqa: E402
from gpn_jax.training import train_step as ts  # noqa: E402
from gpn_jax.training.optimizer import make_optimizer  # noqa: E402
from tests.tolerance import f32_bound  # noqa: E402

CONFIGS = {"gpn_m": gpn_m_tiny, "gdn": gdn_tiny, "transformer": transformer_tiny}
MC = [  # question, choices, gold; two share a context (one pass must serve both)
    ("A dictionary maps", [" keys to values", " files to lines", " the", " iterators"], 0),
    ("The interpreter reads the file and", [" executes it", " stops", " sleeps", " x"], 0),
    ("Generators return ", ["an iterator", "a list", "nothing", "values"], 0),
]
DOCS = [
    "The with statement wraps the execution of a block with methods defined by a context "
    "manager. A dictionary maps hashable keys to arbitrary values.",
    "Generators return an iterator.",
    "x",
]
LAMBADA = [
    "The interpreter reads the file and then executes every statement",
    "A dictionary maps hashable keys to arbitrary values",
    "Generators return an iterator",
]


def ll_bound(positions: int) -> float:
    """Float32 bound (tests/tolerance.py) for a log-likelihood (a sum of same-sign CEs) computed by
    two programs (batched and in pieces vs batch 1): each CE follows up to `positions` steps of
    reductions no longer than the tiny configs' d_ffn = 128, then the 512-way logsumexp; margin
    1, the chain's length being the worst case already."""
    return f32_bound(positions * 128 + 512, 1)


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(embedded_corpus(), 512)


def save_run(root, name, tokenizer, **model_overrides):
    """A tiny run's workdir: its config, initial parameters (seed 1) and tokenizer."""
    c = CONFIGS[name].get_config()
    c.model.update(model_overrides)
    wd = str(root / name)
    model = factory.build_model(c.model)
    opt = make_optimizer(c.train, model.weight_decay_mask)
    state = ts.init_train_state(model, opt, jax.random.PRNGKey(1))
    os.makedirs(wd, exist_ok=True)
    tokenizer.save(os.path.join(wd, "tokenizer.model"))
    with Checkpointer(wd, keep=None, async_save=False) as ckpt:
        ckpt.save(1, state, {}, c.to_dict(), {"step": 1}, force=True)
    return wd


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("runs")
    return {name: save_run(root, name, tokenizer) for name in CONFIGS}


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """Task YAMLs over local jsonl files (an --include_path directory)."""
    d = tmp_path_factory.mktemp("tasks")
    rows = {
        "mc": [{"q": q, "choices": c, "gold": g} for q, c, g in MC],
        "roll": [{"text": t} for t in DOCS],
        "lmb": [{"text": t} for t in LAMBADA],
        "gen": [{"q": "A dictionary maps"}, {"q": "Generators return"}],
    }
    for name, records in rows.items():
        (d / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    common = f"dataset_path: json\ntest_split: test\ndataset_kwargs:\n  data_files:\n    test: {d}"
    yamls = {
        "mc": "output_type: multiple_choice\ndoc_to_text: '{{q}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{gold}}'\ntarget_delimiter: ''\nmetric_list:\n  - metric: acc",
        "roll": "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
        "metric_list:\n  - metric: bits_per_byte",
        "lmb": "output_type: loglikelihood\ndoc_to_text: \"{{text.split(' ')[:-1]|join(' ')}}\"\n"
        "doc_to_target: \"{{' '+text.split(' ')[-1]}}\"\ntarget_delimiter: ''\nmetric_list:\n"
        "  - metric: perplexity\n    aggregation: perplexity\n    higher_is_better: false\n"
        "  - metric: acc\n    aggregation: mean\n    higher_is_better: true",
        "gen": "output_type: generate_until\ndoc_to_text: '{{q}}'\ndoc_to_target: ''\n"
        "generation_kwargs:\n  until: ['.']\n  max_gen_toks: 6\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match",
    }
    for name, body in yamls.items():
        head = f"task: gpnt_{name}\n{common}/{name}.jsonl\n"
        (d / f"gpnt_{name}.yaml").write_text(head + textwrap.dedent(body) + "\n")
    return str(d)


@functools.lru_cache(maxsize=1)
def task_manager(tasks_dir):
    # only the tests' own tasks: indexing lm-eval's ~14,000 task files takes ~12 s per process
    return TaskManager(include_path=tasks_dir, include_defaults=False)


def evaluate(lm, tasks_dir, task):
    out = lm_eval.simple_evaluate(
        model=lm, tasks=[task], task_manager=task_manager(tasks_dir),
        log_samples=True, num_fewshot=0,
    )  # fmt: skip
    return out["results"][task], out["samples"][task]


@functools.lru_cache(maxsize=8)
def _jit_token_losses(model):
    return jax.jit(model.token_losses)


def direct_ll(model, params, context, cont):
    """log p(cont | context) with one `token_losses` pass over context + cont (batch 1),
    right-padded to one length per model (causal: padding after the scored tokens changes
    nothing) so the reference compiles once, not once per request length."""
    ids = context + cont
    length = getattr(model.config, "max_seq_len", 0) or 64 * -(-len(ids) // 64)
    tokens = np.zeros((1, length), np.int32)
    tokens[0, : len(ids)] = ids
    ce, _ = _jit_token_losses(model)(params, tokens)
    return -float(np.asarray(ce, np.float64)[0, len(context) : len(ids)].sum())


def split(tok, context, cont):
    """The harness's boundary rule: trailing context spaces move to the continuation, and the
    continuation is what encoding the whole string adds after the context's tokens."""
    n = len(context) - len(context.rstrip())
    if n:
        context, cont = context[:-n], context[-n:] + cont
    whole, ctx = tok.encode(context + cont), tok.encode(context)
    return ctx, whole[len(ctx) :]


FAMILIES = ["gpn_m", "transformer", pytest.param("gdn", marks=pytest.mark.slow)]  # gdn: ~60 s


@functools.cache
def evaluate_mc(workdir, tasks_dir):
    """(lm, results, samples) of gpnt_mc on a run, contexts in pieces 4, 2, 1: computed once
    for the tests that read it (none calls the lm again, so its stats stay this run's)."""
    lm = GPNLM(workdir=workdir, batch_size=3, window=4)
    return (lm, *evaluate(lm, tasks_dir, "gpnt_mc"))


@pytest.mark.parametrize("family", FAMILIES)
def test_multiple_choice_equals_direct_token_losses(family, runs, tasks, tokenizer):
    lm, res, samples = evaluate_mc(runs[family], tasks)
    m, p = lm.model, lm.params
    right = 0
    for s in samples:
        q, choices, gold = MC[s["doc_id"]]
        want = [direct_ll(m, p, *split(tokenizer, q, c)) for c in choices]
        got = [r[0][0] for r in s["resps"]]
        # <= 32 positions of context and continuation; every CE is > 0: no atol
        np.testing.assert_allclose(got, want, rtol=ll_bound(32))
        right += int(np.argmax(want) == gold)
    assert res["acc,none"] == right / len(MC)
    if family != "transformer":  # one carry per distinct context, 12 requests
        assert lm.stats.context_passes == len(MC)


def direct_rolling(model, params, tokens):
    """Recurrent: one pass over the whole document. Transformer++: the harness's disjoint
    windows, each [previous token] + up to max_seq_len - 1 new tokens, scored one by one."""
    if model.init_state(1) is not None:
        return direct_ll(model, params, [], tokens)
    L, total, done = model.config.max_seq_len, 0.0, 0
    while done < len(tokens):
        n = min(L - 1, len(tokens) - done)
        context = [] if done == 0 else [tokens[done - 1]]
        total += direct_ll(model, params, context, tokens[done : done + n])
        done += n
    return total


@pytest.mark.parametrize("family", FAMILIES)
def test_rolling_equals_direct_token_losses(family, runs, tasks, tokenizer):
    lm = GPNLM(workdir=runs[family], batch_size=2, window=8)  # several windows per document
    res, samples = evaluate(lm, tasks, "gpnt_roll")
    assert len(tokenizer.encode(DOCS[0])) > 32  # longer than the Transformer's context
    total_ll, total_bytes = 0.0, 0
    for s in samples:
        doc = DOCS[s["doc_id"]]
        want = direct_rolling(lm.model, lm.params, tokenizer.encode(doc))
        # documents of <= 80 tokens (windows of <= 32 for the Transformer); every CE is > 0
        assert s["resps"][0][0] == pytest.approx(want, rel=ll_bound(80))
        total_ll, total_bytes = total_ll + want, total_bytes + len(doc.encode())
    bpb = -total_ll / total_bytes / math.log(2)
    assert res["bits_per_byte,none"] == pytest.approx(bpb, rel=ll_bound(80))


@pytest.fixture(scope="module")
def lambada_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("lambada") / "lambada.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in LAMBADA))
    return str(path)


@functools.cache
def evaluate_harness_protocol(workdir, path):
    """`gpn_jax.evaluate`'s harness-protocol LAMBADA numbers of a run: once per run for the
    tests that compare a harness task with them."""
    lm = GPNLM(workdir=workdir)
    return lambada.evaluate_lambada(lm.model, lm.params, lm.tok, path)["harness"]


@pytest.mark.parametrize("family", ["gpn_m", "transformer"])
def test_lambada_style_task_equals_evaluate_harness_protocol(
    family, runs, tasks, lambada_file, monkeypatch
):
    # lm-eval bootstraps the accuracy's stderr; with our model it must not fork this JAX process
    monkeypatch.delenv("DISABLE_MULTIPROC", raising=False)
    monkeypatch.setattr(os, "fork", lambda: pytest.fail("lm-eval forked the JAX process"))
    lm = GPNLM(workdir=runs[family], batch_size=2)
    res, _ = evaluate(lm, tasks, "gpnt_lmb")
    assert res["acc_stderr,none"] >= 0  # bootstrapped, here
    ours = evaluate_harness_protocol(runs[family], lambada_file)
    assert res["acc,none"] == ours["acc"]
    # exp of a mean log-likelihood: the PPL's relative error is the mean's absolute error,
    # log(ppl) x its relative error (examples of <= 40 tokens)
    bound = math.log(ours["ppl"]) * ll_bound(40)
    assert res["perplexity,none"] == pytest.approx(ours["ppl"], rel=bound)


@pytest.mark.parametrize("family", ["gpn_m", "transformer"])
def test_generate_until_is_greedy_decoding_cut_at_the_stop_string(family, runs, tasks):
    lm = GPNLM(workdir=runs[family])
    _, samples = evaluate(lm, tasks, "gpnt_gen")
    for s in samples:
        prompt = lm.tok.encode(s["doc"]["q"])
        cfg = sampling.SamplingConfig(greedy=True)
        ids = sampling.generate(lm.model, lm.params, prompt, 6, cfg, eos_id=lm.tok.eos_id)
        want = lm.tok.decode(ids["tokens"][0]).split(".")[0]
        assert s["resps"][0][0] == want


def test_transformer_context_longer_than_max_seq_len_is_cut_from_the_left(runs, tokenizer, caplog):
    lm = GPNLM(workdir=runs["transformer"])
    L = lm.model.config.max_seq_len
    context = " ".join(DOCS * 2)
    ctx, cont = split(tokenizer, context, " values")
    assert len(ctx) + len(cont) > L

    class Req:
        args = (context, " values")

    (got, _), = lm.loglikelihood([Req()])  # fmt: skip
    kept = (ctx + cont)[-L:]
    want = direct_ll(lm.model, lm.params, kept[: -len(cont)], cont)
    assert got == pytest.approx(want, rel=ll_bound(L)) and lm.stats.truncated == 1
    assert "cut from the left" in caplog.text


def cli(*args):
    env = dict(os.environ, JAX_PLATFORMS="cpu", HF_DATASETS_OFFLINE="1")
    return subprocess.run(
        [sys.executable, "-m", "gpn_jax.harness", *args],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_cli_passes_lm_eval_flags_through(runs, tasks, tmp_path, capsys):
    """In-process (`gpn_jax.harness.run`, what `python -m gpn_jax.harness` calls): the
    one-command test below runs the same path in a fresh interpreter."""
    out = tmp_path / "out"
    harness.run([
        "--model_args", f"workdir={runs['gpn_m']},batch_size=4", "--tasks", "gpnt_mc",
        "--include_path", tasks, "--limit", "2", "--output_path", str(out),
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert "lm-eval's built-in tasks are not indexed" in err  # gpnt_mc is local
    (result,) = list(out.rglob("results_*.json"))
    r = json.loads(result.read_text())
    assert "acc,none" in r["results"]["gpnt_mc"] and r["n-samples"]["gpnt_mc"]["effective"] == 2


@pytest.mark.slow
def test_bad_model_args_are_one_line_errors_from_the_cli(runs, tasks):
    proc = cli("--model_args", f"workdir={runs['gpn_m']},colour=3", "--tasks", "gpnt_mc",
               "--include_path", tasks)  # fmt: skip
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    want = "gpn-harness: error: unknown --model_args key(s) ['colour']"
    assert last.startswith(want), proc.stderr[-2000:]


@pytest.mark.parametrize(
    "model_args, match",
    [
        ("workdir={wd},batch_size=0", "batch_size must be an integer >= 1"),
        ("workdir={empty}", "no checkpoint in"),
    ],
)
def test_bad_model_args_are_one_line_errors(
    model_args, match, runs, tasks, tmp_path, capsys, monkeypatch
):
    """The same path in-process (a subprocess per case costs ~20 s of imports), refused before
    lm-eval indexes its task files (~12 s)."""

    def indexing(*_, **__):
        raise AssertionError("lm-eval's task index was built before the model_args check")

    monkeypatch.setattr(TaskManager, "__init__", indexing)
    args = model_args.format(wd=runs["gpn_m"], empty=tmp_path)
    with pytest.raises(SystemExit) as exit_:
        harness.run(["--model_args", args, "--tasks", "gpnt_mc", "--include_path", tasks])
    assert exit_.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("gpn-harness: error:") and match in err[-1], err[-5:]


def test_tasks_all_in_include_path_are_indexed_without_lm_evals_built_in_ones(tasks, tmp_path):
    """lm-eval's CLI then indexes --include_path alone (the same tasks load); a built-in name, a
    group or no --include_path keeps its full index."""
    assert (
        harness_run.local_tasks(["--tasks", "gpnt_mc,gpnt_lmb", "--include_path", tasks]) == tasks
    )
    assert harness_run.local_tasks(["-t", "gpnt_mc", f"--include_path={tasks}"]) == tasks
    assert harness_run.local_tasks(["--tasks", "gpnt_mc,piqa", "--include_path", tasks]) is None
    assert harness_run.local_tasks(["--tasks", "gpnt_mc"]) is None
    (tmp_path / "group.yaml").write_text("group: gpnt_both\ntask:\n  - gpnt_mc\n  - gpnt_lmb\n")
    (tmp_path / "mc.yaml").write_text(open(os.path.join(tasks, "gpnt_mc.yaml")).read())
    assert (
        harness_run.local_tasks(["--tasks", "gpnt_both", "--include_path", str(tmp_path)]) is None
    )
    full = lm_eval.tasks.TaskManager
    with harness_run.task_index(["--tasks", "gpnt_mc", "--include_path", tasks]):
        local = lm_eval.tasks.TaskManager(include_path=tasks)  # as lm-eval's CLI builds it
        assert local.all_tasks == ["gpnt_gen", "gpnt_lmb", "gpnt_mc", "gpnt_roll"]
        assert local.load(["gpnt_mc"])["tasks"]["gpnt_mc"].config.task == "gpnt_mc"
    assert lm_eval.tasks.TaskManager is full
    with harness_run.task_index(["--tasks", "gpnt_mc,piqa", "--include_path", tasks]):
        assert lm_eval.tasks.TaskManager is full


def test_model_args_are_found_in_every_spelling_lm_eval_accepts():
    argv = ["--tasks", "t", "--model_args", "workdir=/r", "batch_size=2", "--limit", "2"]
    assert harness_run.flag_values(argv, "--model_args", "-a") == ["workdir=/r", "batch_size=2"]
    assert harness_run.flag_values(["-a", "workdir=/r,step=3"], "--model_args", "-a") == [
        "workdir=/r,step=3"
    ]
    assert harness_run.flag_values(["--model_args=workdir=/r"], "--model_args", "-a") == [
        "workdir=/r"
    ]
    assert harness_run.flag_values(harness_run.harness_argv(["--tasks", "t"]), "--model", "-M") == [
        "gpn_jax"
    ]


@pytest.mark.slow
def test_paper_table_fills_local_tasks_and_says_what_it_could_not(runs, tasks, lambada_file):
    from experiments import harness_table as pt

    rows = [{"label": "GPN+M", "workdir": runs["gpn_m"]}]
    t = pt.harness_table(rows, "gpnt_lmb,piqa,nosuchtask", include_path=tasks)
    ours = evaluate_harness_protocol(runs["gpn_m"], lambada_file)
    assert t["rows"][0]["gpnt_lmb acc"] == ours["acc"]
    bound = math.log(ours["ppl"]) * ll_bound(40)  # as in the lambada-style test above
    assert t["rows"][0]["gpnt_lmb perplexity"] == pytest.approx(ours["ppl"], rel=bound)
    assert "not available offline" in t["missing"]["PIQA acc"]
    assert "unknown to lm-eval" in t["missing"]["nosuchtask"]
    assert t["missing"]["Wiki. ppl"] == "task 'wikitext' not in --tasks"
    assert t["missing"]["Avg."].startswith("needs every accuracy column")
    md = pt.markdown(t)
    assert "| GPN+M | — |" in md and "- PIQA acc: not filled: task 'piqa'" in md


def test_zero_shot_expands_to_the_papers_tasks_and_own_flags_are_taken_out():
    argv = harness_run.harness_argv(["--tasks", "zero_shot,mine", "--output_path", "zero_shot"])
    assert argv[:2] == ["--model", "gpn_jax"] and argv[-2:] == ["--output_path", "zero_shot"]
    assert argv[3].split(",") == [*harness_run.ZERO_SHOT, "mine"]
    assert harness_run.harness_argv(["--tasks=zero_shot"])[2] == "--tasks=" + ",".join(
        harness_run.ZERO_SHOT
    )
    rest, own = harness_run.own_flags(["--tasks", "t", "--out", "r.json", "--label=GPN+M"])
    assert rest == ["--tasks", "t"] and own == {"out": "r.json", "label": "GPN+M"}
    with pytest.raises(ValueError, match="--out needs a value"):
        harness_run.own_flags(["--out"])


@pytest.mark.slow
def test_cli_out_is_a_result_file_of_the_scores_that_the_zero_shot_table_renders(
    runs, tasks, tmp_path
):
    """The one-command path (`--tasks` over a local task, `--out`), then the table."""
    import importlib.util

    out = tmp_path / "zero_shot.json"
    proc = cli("--model_args", f"workdir={runs['gpn_m']},batch_size=2", "--tasks", "gpnt_lmb",
               "--include_path", tasks, "--out", str(out), "--label", "GPN+M")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["label"] == "GPN+M" and record["command"].startswith("python -m gpn_jax.harness")
    scores = {r["column"]: r["value"] for r in record["rows"]}
    res, _ = evaluate(GPNLM(workdir=runs["gpn_m"], batch_size=2), tasks, "gpnt_lmb")
    assert scores["gpnt_lmb acc"] == res["acc,none"]
    bound = math.log(res["perplexity,none"]) * ll_bound(40)  # as in the lambada-style test
    assert scores["gpnt_lmb perplexity"] == pytest.approx(res["perplexity,none"], rel=bound)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location(
        "rr", os.path.join(root, "tools", "render_results.py")
    )
    rr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rr)
    lines = rr.print_table("zero_shot", [str(out)], None).splitlines()
    assert lines[0] == "| Model | gpnt_lmb perplexity | gpnt_lmb acc |"
    acc, ppl = scores["gpnt_lmb acc"], scores["gpnt_lmb perplexity"]
    assert lines[2] == f"| GPN+M | {ppl:.2f} | {acc:.3f} |"


def test_a_run_trained_with_remat_segments_scores_pieces_of_any_length(
    runs, tasks, tokenizer, tmp_path
):
    """Segments (a training-memory knob), and how they rerun, are off for scoring: same
    scores, any piece length."""
    seg = save_run(tmp_path, "gpn_m", tokenizer, remat_segment=16, remat_parallel=True)
    _, res, _ = evaluate_mc(seg, tasks)
    _, plain, _ = evaluate_mc(runs["gpn_m"], tasks)
    assert res["acc,none"] == plain["acc,none"]


def test_a_dataset_not_cached_while_offline_says_how_to_download_it(tmp_path):
    """Issue 84: the README's harness command failed offline with datasets' "Couldn't reach
    'EleutherAI/lambada_openai' on the Hub (OfflineModeIsEnabled)" and no way forward. Here
    datasets raises its real error (an empty cache, downloads off) and the line says both ways
    on; any other error is not rewritten."""
    code = textwrap.dedent(
        """\
        import datasets
        from gpn_jax.eval import harness_run
        try:
            datasets.load_dataset("EleutherAI/lambada_openai", split="test")
        except Exception as e:
            print(harness_run.offline_error(e))
        """
    )
    env = dict(os.environ, HF_HOME=str(tmp_path), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    line = out.stdout.strip()
    assert line.count("\n") == 0 and "Couldn't reach 'EleutherAI/lambada_openai'" in line, out
    assert "run once with HF_DATASETS_OFFLINE=0 HF_HUB_OFFLINE=0" in line
    assert "--include_path DIR" in line
    assert harness_run.offline_error(ValueError("another error")) is None
