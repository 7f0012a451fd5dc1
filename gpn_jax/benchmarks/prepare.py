"""Benchmark of `gpn_jax.prepare` and of the `bin:` data loader (prints figures; asserts nothing).

    python -m gpn_jax.bench_prepare --sizes_mb=50,500 --workers=1,2 \\
        --workdir=runs/bench_prepare [--out=prepare.json]

For each size a synthetic jsonl corpus is generated once (no download): documents of
sentences of words drawn Zipf-like from the vocabulary of the embedded pydoc corpus. A
SentencePiece tokenizer (`--vocab_size`) is trained once on a sample of the smallest corpus.
Each (size, workers) run is `python -m gpn_jax.prepare` in its own process: wall time,
tokens/s (whole command, and as `prepare` itself reports it, which leaves out interpreter
and worker start-up), and the peak RSS of the prepare process alone and summed with its
workers (sampled every 50 ms: the kernel's own maximum, from wait4, would also count the
benchmark process that forked it). Then the data loader alone: batches/s of the training
window pipeline (Grain) over the last run's `bin:` shards at `--batch_size` x `--seq_len`,
per layout, next to the hand-written numpy loop it replaced.
Wall-clock figures: on a shared machine other jobs lower them (`load_average` is printed).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np

from gpn_jax.benchmarks import workdirs
from gpn_jax.io import paths, untrusted
from gpn_jax.io.regular import bounded_lines, open_regular


def word_table() -> tuple[np.ndarray, np.ndarray]:
    """(forms, cdf): each word of the embedded corpus (by frequency rank) in six written forms
    — plain, capitalised, sentence end, both, paragraph end, both — and Zipf-like cumulative
    probabilities over the words."""
    from collections import Counter

    from gpn_jax.data.text_sources import embedded_corpus

    found = (w.lower() for doc in embedded_corpus() for w in re.findall(r"[A-Za-z]{2,}|\ba\b", doc))
    words = [w for w, _ in Counter(found).most_common()]
    caps = [w.capitalize() for w in words]
    forms = [f"{w} " for w in words] + [f"{w} " for w in caps]
    forms += [f"{w}. " for w in words] + [f"{w}. " for w in caps]
    forms += [f"{w}.\n\n" for w in words] + [f"{w}.\n\n" for w in caps]
    cdf = np.cumsum(1.0 / np.arange(1, len(words) + 1))
    return np.array(forms, dtype=object), cdf / cdf[-1]


def synthetic_document(rng, forms, cdf) -> str:
    """100-1500 words in sentences of 8-24 words (capitalised, full stop), six sentences to
    a paragraph."""
    n, vocab = int(rng.integers(100, 1500)), len(cdf)
    ids = np.minimum(np.searchsorted(cdf, rng.random(n)), vocab - 1)
    ends = np.cumsum(rng.integers(8, 25, size=n // 8 + 1)) - 1
    ends = np.append(ends[ends < n - 1], n - 1)
    form = np.zeros(n, np.int64)
    form[0] = 1
    form[ends[:-1] + 1] = 1  # capitalised after each sentence end
    form[ends] += 2  # sentence end
    form[ends[5::6]] += 2  # every sixth sentence also ends its paragraph
    return "".join(forms[ids + form * vocab]).rstrip()


def make_corpus(path: str, megabytes: int, seed: int = 0) -> str:
    """Writes (once) a jsonl corpus of about `megabytes` MB to `path`."""
    if os.path.exists(path):
        return path
    rng, (forms, cdf) = np.random.default_rng(seed), word_table()
    written, target = 0, megabytes * 1_000_000
    with paths.atomic_open(path) as f:
        while written < target:
            line = json.dumps({"text": synthetic_document(rng, forms, cdf)}) + "\n"
            f.write(line.encode())
            written += len(line)
    return path


def make_tokenizer(corpus: str, path: str, vocab_size: int, docs: int = 2000) -> str:
    if not os.path.exists(path):
        from gpn_jax.data.tokenizer import train_tokenizer

        f, _ = open_regular(corpus)
        with f:
            lines = zip(range(docs), bounded_lines(f, corpus), strict=False)
            sample = [json.loads(line)["text"] for _, line in lines]
        train_tokenizer(sample, vocab_size, path)
    return path


def run_prepare(corpus: str, tokenizer: str, output: str, workers: int) -> dict:
    """One timed `python -m gpn_jax.prepare` run; peak RSS sampled over its process tree."""
    import psutil

    shutil.rmtree(output, ignore_errors=True)
    cmd = [sys.executable, "-m", "gpn_jax.prepare", f"--input={corpus}", f"--output={output}"]
    cmd += [f"--tokenizer_path={tokenizer}", f"--workers={workers}", "--progress=false"]
    log = workdirs.open_new(os.path.join(os.path.dirname(output), "prepare.log"), "w+")
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
    peak_main = peak_tree = 0
    while proc.poll() is None:
        try:
            main = psutil.Process(proc.pid)
            rss = [p.memory_info().rss for p in (main, *main.children(recursive=True))]
            peak_main, peak_tree = max(peak_main, rss[0]), max(peak_tree, sum(rss))
        except psutil.Error:
            pass
        time.sleep(0.05)
    wall = time.time() - start
    log.seek(0)
    out = log.read()
    if proc.returncode:
        raise RuntimeError(f"prepare failed: {out.strip().splitlines()[-1:]}")
    manifest = untrusted.read_json(os.path.join(output, "manifest.json"), fix="a bug: report it")
    tokens = sum(s["tokens"] for s in manifest["splits"].values())
    own = re.search(r"([\d,]+) tokens/s", out.strip().splitlines()[-1])
    return {
        "workers": workers,
        "tokens": tokens,
        "wall_s": round(wall, 2),
        "tokens_per_s": round(tokens / wall),
        "tokens_per_s_reported": int(own.group(1).replace(",", "")) if own else None,
        "peak_rss_main_mb": round(peak_main / 2**20, 1),
        "peak_rss_with_workers_mb": round(peak_tree / 2**20, 1),
    }


def loader_rates(output: str, vocab_size: int, batch: int, seq: int, n: int) -> list[dict]:
    """Batches/s of the training window pipeline alone on the prepared `bin:` shards, per
    layout: the Grain pipeline the trainer uses (`data.train`) and, in the same run, the
    hand-written loop it replaced (`WindowIterator.batch_at`: the same windows read in
    numpy, no prefetch). Each is timed twice, alternating, and the faster pass kept (the
    machine may be shared)."""
    from gpn_jax.data.pipeline import build_data

    rows = []
    for layout in ("shuffled", "streams"):
        data = build_data(
            f"bin:{output}", vocab_size=vocab_size, seq_len=seq, batch_size=batch,
            heldout_fraction=0.0, train_layout=layout,
        )  # fmt: skip
        rows.append({"layout": layout, "batch": [batch, seq], **_compare(data.train, n)})
    return rows


def _compare(it, n: int) -> dict:
    """Batches/s of `it` (Grain) and of its `batch_at` loop (hand-written), best of two."""
    steps = iter(range(10**9))
    it.batch_at(next(steps)), next(it)  # first touch of the mapping
    grain_rate = hand_rate = 0.0
    for _ in range(2):
        hand_rate = max(hand_rate, _rate(lambda: it.batch_at(next(steps)), n))
        grain_rate = max(grain_rate, _rate(lambda: next(it), n))
    return {"grain_batches_per_s": round(grain_rate, 1),
            "hand_written_batches_per_s": round(hand_rate, 1)}  # fmt: skip


def _rate(read, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        read()
    return n / (time.perf_counter() - start)


def run(sizes_mb, workers, workdir, out, vocab_size, batch_size, seq_len, loader_batches, keep):
    """Generates the corpora, times `prepare` per (size, workers) and the loader; writes JSON."""
    workdir = workdirs.prepare(workdir, "gpn-bench-prepare")
    results = {"load_average_start": os.getloadavg(), "cpus": os.cpu_count(), "prepare": []}
    corpora = {
        mb: make_corpus(os.path.join(workdir, f"corpus_{mb}mb.jsonl"), mb) for mb in sizes_mb
    }
    tok = make_tokenizer(corpora[min(sizes_mb)], os.path.join(workdir, "bench.model"), vocab_size)
    output = os.path.join(workdir, "prepared")
    for mb in sizes_mb:
        for w in workers:
            row = {"corpus_mb": mb, **run_prepare(corpora[mb], tok, output, w)}
            print(json.dumps(row), flush=True)
            results["prepare"].append(row)
    results["loader"] = loader_rates(output, vocab_size, batch_size, seq_len, loader_batches)
    for row in results["loader"]:
        print(json.dumps(row), flush=True)
    results["load_average_end"] = os.getloadavg()
    if not keep:
        shutil.rmtree(output, ignore_errors=True)
    path = out or os.path.join(workdir, "prepare.json")
    with workdirs.open_new(path) as f:
        json.dump(results, f, indent=1)
    print(f"results: {path}; load average {results['load_average_start']} -> "
          f"{results['load_average_end']}")  # fmt: skip
    return results
