"""The rehearsal's own parts (launch/rehearse.sh): the page's commands, stand-in downloads, the
preemption, the checks. Run from the repository root:

    python launch/rehearsal.py blocks docs/paper_run.md    # the page's `bash rehearse` blocks
    python launch/rehearsal.py data DIR                    # stands in for the downloads
    python launch/rehearsal.py preempt RUN_WORKDIR OUT     # SIGTERM to host 1's trainer, midway
    python launch/rehearsal.py check DIR                   # what the rehearsal must have shown
"""

import json
import os
import re
import signal
import sys
import time

FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
TAG = "rehearse"
PREEMPT_AFTER = 3  # steps logged before the SIGTERM
TIMEOUT_S = 900


def blocks(text: str, tag: str = TAG) -> list[str]:
    """Bodies of the fenced blocks whose info string is `bash <tag>`, in page order."""
    return [m["body"] for m in FENCE.finditer(text) if m["info"].split()[1:2] == [tag]]


def env_names(text: str) -> list[str]:
    """The variables the page's `bash env` block exports (the rehearsal sets every one)."""
    names = []
    for body in blocks(text, "env"):
        for line in body.splitlines():
            if line.startswith("export "):
                names += re.findall(r"(\w+)=", line.split("#")[0])
    return names


def write_data(root: str) -> None:
    """Stand-ins for what the user downloads: a parquet corpus laid out like FineWeb-Edu's
    sample-10BT (the documentation text every CPython ships), a SentencePiece model in place
    of LLaMA-2's (vocab 2048, the `:cpu` configs' size), a LAMBADA-style jsonl and one local
    lm-eval task over it (the zero-shot set's datasets cannot be downloaded here)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gpn_jax.data.text_sources import embedded_corpus
    from gpn_jax.data.tokenizer import train_tokenizer

    docs = [d for d in embedded_corpus() if len(d.split()) > 20]
    raw = os.path.join(root, "raw", "sample", "10BT")
    os.makedirs(raw, exist_ok=True)
    half = len(docs) // 2
    for i, part in enumerate((docs[:half], docs[half:])):
        pq.write_table(pa.table({"text": part}), os.path.join(raw, f"00{i}_00000.parquet"))
    os.makedirs(os.path.join(root, "tokenizer"), exist_ok=True)
    train_tokenizer(docs, 2048).save(os.path.join(root, "tokenizer", "tokenizer.model"))
    sentences = [s.strip() for d in docs[-8:] for s in d.split(".") if len(s.split()) > 6]
    lambada = [{"text": " ".join(s.split()[:24])} for s in sentences[:12]]
    with open(os.path.join(root, "lambada.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in lambada)
    tasks = os.path.join(root, "tasks")
    os.makedirs(tasks, exist_ok=True)
    with open(os.path.join(tasks, "rehearsal_lambada.yaml"), "w") as f:
        f.write(
            "task: rehearsal_lambada\ndataset_path: json\ntest_split: test\n"
            f"dataset_kwargs:\n  data_files:\n    test: {root}/lambada.jsonl\n"
            "output_type: loglikelihood\n"
            "doc_to_text: \"{{text.split(' ')[:-1]|join(' ')}}\"\n"
            "doc_to_target: \"{{' '+text.split(' ')[-1]}}\"\ntarget_delimiter: ''\n"
            "metric_list:\n  - metric: perplexity\n    aggregation: perplexity\n"
            "    higher_is_better: false\n  - metric: acc\n    aggregation: mean\n"
            "    higher_is_better: true\n"
        )


def logged_steps(workdir: str) -> list[int]:
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    rows = [json.loads(x) for x in open(path).read().splitlines() if x.strip().endswith("}")]
    return [r["step"] for r in rows if "loss" in r]


def preempt(workdir: str, out: str) -> None:
    """Waits for the run to log PREEMPT_AFTER steps, then sends SIGTERM to host 1's trainer
    (what a maintenance event does to one host) and records the step it saw."""
    pid_file = os.path.join(workdir, "job", "1.trainer.pid")
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        steps = logged_steps(workdir)
        if steps and max(steps) >= PREEMPT_AFTER and os.path.exists(pid_file):
            pid = int(open(pid_file).read())
            os.kill(pid, signal.SIGTERM)
            with open(out, "w") as f:
                json.dump({"pid": pid, "seen_step": max(steps)}, f)
            print(f"[rehearsal] SIGTERM to host 1's trainer (pid {pid}) after step {max(steps)}")
            return
        time.sleep(0.05)
    sys.exit("[rehearsal] the TPU run never logged enough steps to preempt")


def _fail(msg: str) -> None:
    sys.exit(f"[rehearsal] FAILED: {msg}")


def check(root: str) -> None:
    """What the rehearsal must have shown; one line per failure, exit 1."""
    runs = {name: os.path.join(root, "runs", name) for name in ("gpn_m", "transformer", "gdn")}
    steps = int(os.environ["REHEARSAL_STEPS"])
    for name, workdir in runs.items():
        if not os.path.exists(os.path.join(workdir, "final_metrics.json")):
            _fail(f"{name}: no final_metrics.json in {workdir}")
        if logged_steps(workdir) != list(range(1, steps + 1)):
            _fail(f"{name}: metrics steps {logged_steps(workdir)} are not 1..{steps} once each")
    if not os.path.exists(os.path.join(root, "preempted.json")):
        _fail("the TPU run was never preempted")
    logs = [open(os.path.join(runs["gpn_m"], "job", f"{i}.log")).read() for i in range(2)]
    for i, log in enumerate(logs):
        if "SIGTERM: saved step" not in log or "Resuming from checkpoint step" not in log:
            _fail(f"host {i} did not save on SIGTERM and resume (see its job log)")
    tpu = os.path.join(root, "standin", "tpus", "rehearsal")
    for i in range(2):
        pip = open(os.path.join(tpu, f"worker{i}", "pip.log")).read()
        if "-e .[tpu]" not in pip:
            _fail(f"TPU worker {i} did not install .[tpu]: {pip!r}")
    pip = open(os.path.join(root, "standin", "hosts", "gpu0", "pip.log")).read()
    if "-e .[gpu]" not in pip:
        _fail(f"the GPU node did not install .[gpu]: {pip!r}")
    evals = os.path.join(root, "eval")
    for f in ("gpn_m.json", "gdn.json", "transformer.json", "paper_run.json", "zero_shot.json"):
        if not os.path.exists(os.path.join(evals, f)):
            _fail(f"no {f} in {evals}")
    if not os.path.exists(os.path.join(root, "exports", "gpn_m_1l", "model.safetensors")):
        _fail("no exported model")
    print("[rehearsal] checks passed: 3 runs to their last step, 1 preemption resumed, "
          "evaluations, export and both tables written")  # fmt: skip


def main(argv: list[str]) -> None:
    cmd, args = argv[0], argv[1:]
    if cmd == "blocks":
        print("\n".join(blocks(open(args[0]).read())))
    elif cmd == "env":
        print(" ".join(env_names(open(args[0]).read())))
    elif cmd == "data":
        write_data(args[0])
    elif cmd == "preempt":
        preempt(*args)
    elif cmd == "check":
        check(args[0])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
