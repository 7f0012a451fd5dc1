"""`prepare_corpus(options)`: a corpus -> tokenizer -> whole-document held-out split ->
fixed-size token shards per split -> `manifest.json`, streamed in bounded chunks of records
over `workers` processes, resumable after a kill (see `shards` and `manifest`)."""

import contextlib
import dataclasses
import os
import signal
import time

import numpy as np
from tqdm.auto import tqdm

from gpn_jax.data.prepare import encode
from gpn_jax.data.prepare.heldout import HeldoutChoice, check_heldout, heldout_choice
from gpn_jax.data.prepare.inputs import Position, open_source
from gpn_jax.data.prepare.manifest import (
    FORMAT,
    MANIFEST,
    MARKER,
    PROGRESS,
    SPLITS,
    TOKENIZER,
    check_output,
    claim_output,
    write_json,
)
from gpn_jax.data.prepare.parallel import ordered_map
from gpn_jax.data.prepare.shards import ShardWriter
from gpn_jax.data.prepare.tokenizer_step import corpus_tokenizer, tokenizer_settings
from gpn_jax.io import lock
from gpn_jax.io.files import sha256_file
from gpn_jax.io.outputs import check_out_dir

# Test hook: SIGKILL this process right after the N-th shard of this run is renamed into
# place, before the progress file records it (the hardest moment to be killed at).
KILL_AFTER_SHARDS_ENV = "GPN_PREPARE_TEST_KILL_AFTER_SHARDS"


@dataclasses.dataclass
class Options:
    """The flags of `gpn_jax.prepare` (see there)."""

    input: str
    output: str
    tokenizer_path: str | None = None
    vocab_size: int = 0
    tokenizer_sample_docs: int = 50_000
    text_field: str = "text"
    data_dir: str | None = None
    workers: int = 0  # 0: every core this process may use
    heldout_fraction: float | None = None  # None: DEFAULT_HELDOUT_FRACTION unless heldout_docs
    heldout_docs: int = 0
    heldout_stratified: bool = False
    seed: int = 0
    shard_tokens: int = 1 << 27
    chunk_records: int = 256
    command: str = ""
    progress: bool = True
    overwrite: bool = False  # replace what gpn-prepare wrote in --output (another corpus)


DEFAULT_HELDOUT_FRACTION = 0.001


def check_options(o: Options) -> None:
    """One-line errors for bad options; fills in the default held-out fraction."""
    if o.heldout_fraction is None:
        o.heldout_fraction = 0.0 if o.heldout_docs else DEFAULT_HELDOUT_FRACTION
    if not o.output:
        raise ValueError("--output is required")
    check_out_dir(o.output, "--output")  # a file there fails now, not after reading the input
    if bool(o.tokenizer_path) == bool(o.vocab_size):
        raise ValueError("give exactly one of --tokenizer_path (existing model) or --vocab_size")
    check_heldout(o.heldout_fraction, o.heldout_docs, o.heldout_stratified)
    for name in ("shard_tokens", "chunk_records", "tokenizer_sample_docs"):
        if getattr(o, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(o, name)}")
    if o.workers < 0:
        raise ValueError(f"--workers must be >= 0, got {o.workers}")


def token_dtype(vocab_size: int) -> str:
    """uint16 when every id fits (vocab <= 65536, e.g. LLaMA-2's 32000), else uint32."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def settings_of(o: Options, source) -> dict:
    """Everything the output bytes depend on (not --workers, --chunk_records, --progress)."""
    settings = {
        "source": source.describe(),
        "text_field": o.text_field,
        "tokenizer": tokenizer_settings(o),
        "heldout_fraction": o.heldout_fraction,
        "heldout_docs": o.heldout_docs,
        "seed": o.seed,
        "shard_tokens": o.shard_tokens,
    }
    if o.heldout_stratified:  # only when set: outputs prepared before the option stay valid
        settings["heldout_stratified"] = True
    return settings


def prepare_corpus(o: Options) -> dict:
    """Prepares (or finishes preparing) `o.output`; returns its manifest."""
    check_options(o)
    source = open_source(o.input, o.data_dir, o.text_field)
    settings = settings_of(o, source)
    with _one_writer(o.output):
        return _prepare_claimed(o, source, settings)


@contextlib.contextmanager
def _one_writer(output: str):
    """Holds `output`'s lock (`io.lock`, as a trainer holds its workdir's) for the block: a
    second gpn-prepare into the same `--output` is refused in one line and touches nothing.
    A lock file this call created in a folder it then refuses (the user's) is removed."""
    os.makedirs(output, exist_ok=True)
    had_lock = os.path.lexists(os.path.join(output, lock.LOCK_FILE))
    held = lock.acquire(output, "gpn-prepare", "--output")
    try:
        yield
    except ValueError:
        if not had_lock and not os.path.exists(os.path.join(output, MARKER)):
            os.remove(held.path)
        raise
    finally:
        held.release()


def _prepare_claimed(o: Options, source, settings: dict) -> dict:
    claim_output(o.output, o.overwrite)  # nothing of the user's is touched (see there)
    manifest, progress = check_output(o.output, settings)
    if manifest is not None:
        print(f"{o.output} is already prepared ({MANIFEST}); nothing to do")
        return manifest
    heldout = heldout_choice(o, source)
    tokenizer, origin = corpus_tokenizer(o, source, progress, heldout)
    job = _Job(o, source, settings, tokenizer, origin, progress, heldout)
    job.run()
    return job.finish()


class _Job:
    """One (possibly resumed) pass: read chunks from the saved position, tokenize them in
    order over the workers, append each to its split's writer, save progress after each."""

    def __init__(self, o, source, settings, tokenizer, origin, progress, heldout: HeldoutChoice):
        self.o, self.source, self.settings, self.heldout = o, source, settings, heldout
        self.tokenizer, self.origin = tokenizer, origin
        self.dtype = token_dtype(tokenizer.vocab_size)
        p = progress or {}
        self.position = Position(**p.get("position", {}))
        self.counts = dict(p.get("counts", {"records": 0, "documents": 0, "heldout": 0}))
        w = p.get("writers", {})
        self.writers = {
            s: ShardWriter(
                os.path.join(o.output, s), self.dtype, o.shard_tokens, tokenizer.eos_id, w.get(s)
            )
            for s in SPLITS
        }
        self.tokens_now, self.shards_now, self.start = 0, 0, time.time()
        self.tokenizer_sha256 = sha256_file(os.path.join(o.output, TOKENIZER))
        self._save_progress()

    def run(self) -> None:
        workers = self.o.workers or _usable_cores()
        chunks = self.source.chunks(self.position, self.o.chunk_records)
        # The workers load the output's own tokenizer.model: a path, not the model's bytes, so
        # each spawned worker's start-up message stays within one pipe buffer and the workers
        # start together (with the bytes, each start waited for the previous worker's imports).
        init = (os.path.join(self.o.output, TOKENIZER), self.o.text_field, self.dtype)
        disable = None if self.o.progress else True  # None: only on a terminal
        with tqdm(unit=" docs", initial=self.counts["documents"], disable=disable) as bar:
            for result in ordered_map(
                encode.encode_task, chunks, workers, encode.init_worker, init
            ):
                docs = self._write(*result)
                rate = self.tokens_now / max(time.time() - self.start, 1e-9)
                text = f"{self.total_tokens():,} tokens, {rate:,.0f} tokens/s"
                bar.set_postfix_str(text, refresh=False)
                bar.update(docs)

    def _write(self, first_record, end, tokens, lengths) -> int:
        held = self.heldout.mask(first_record, lengths, self.counts["documents"])
        in_heldout = np.repeat(held, lengths)
        done = self.writers["heldout"].append(tokens[in_heldout])
        done += self.writers["train"].append(tokens[~in_heldout])
        self._kill_hook(len(done))
        docs = int(np.count_nonzero(lengths))
        self.counts["records"] += len(lengths)
        self.counts["documents"] += docs
        self.counts["heldout"] += int(np.count_nonzero(held))
        self.tokens_now += len(tokens)
        self.position = end
        self._save_progress()
        return docs

    def _kill_hook(self, finished: int) -> None:
        self.shards_now += finished
        limit = os.environ.get(KILL_AFTER_SHARDS_ENV)
        if finished and limit and self.shards_now >= int(limit):
            os.kill(os.getpid(), signal.SIGKILL)

    def total_tokens(self) -> int:
        return sum(_split_tokens(w.state()) for w in self.writers.values())

    def _save_progress(self) -> None:
        for w in self.writers.values():
            w.flush()
        progress = {
            "settings": self.settings,
            "tokenizer_sha256": self.tokenizer_sha256,
            "tokenizer_origin": self.origin,
            "position": dataclasses.asdict(self.position),
            "counts": self.counts,
            "writers": {s: w.state() for s, w in self.writers.items()},
        }
        write_json(os.path.join(self.o.output, PROGRESS), progress)

    def finish(self) -> dict:
        c = self.counts
        if not c["documents"]:
            raise ValueError(f"empty corpus: no non-blank documents in {self.o.input}")
        if c["documents"] == c["heldout"]:
            raise ValueError(f"no training documents: all {c['documents']} are held out")
        shards = {s: w.finish() for s, w in self.writers.items()}
        manifest = self._manifest(shards)
        write_json(os.path.join(self.o.output, MANIFEST), manifest)
        os.remove(os.path.join(self.o.output, PROGRESS))
        print(summary_line(manifest, self.o.output, time.time() - self.start, self.tokens_now))
        return manifest

    def _manifest(self, shards: dict) -> dict:
        eos, c = self.tokenizer.eos_id, self.counts
        splits = {
            s: {
                "shards": [dict(x, file=f"{s}/{x['file']}") for x in shards[s]],
                "tokens": sum(x["tokens"] for x in shards[s]),
                "documents": sum(x["documents"] for x in shards[s]),
            }
            for s in SPLITS
        }
        return {
            "format": FORMAT,
            "command": self.o.command,
            "source": self.settings["source"],
            "settings": self.settings,
            "tokenizer": {
                "file": TOKENIZER,
                "sha256": self.tokenizer_sha256,
                "vocab_size": self.tokenizer.vocab_size,
                "origin": self.origin,
            },
            "dtype": self.dtype,
            "document_separator": {
                "id": eos,
                "piece": self.tokenizer.id_to_piece(eos),
                "placement": "after every document (a document starts after each eos)",
            },
            "documents": c["documents"],
            "records": c["records"],
            "splits": splits,
        }


def _usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _split_tokens(state: dict) -> int:
    return sum(s["tokens"] for s in state["shards"]) + state["pending_tokens"]


def summary_line(manifest: dict, output: str, seconds: float, tokens_now: int) -> str:
    tr, he = manifest["splits"]["train"], manifest["splits"]["heldout"]
    n = len(tr["shards"]) + len(he["shards"])
    return (
        f"prepared {manifest['documents']:,} documents ({tr['documents']:,} train, "
        f"{he['documents']:,} held-out) = {tr['tokens'] + he['tokens']:,} tokens "
        f"({tr['tokens']:,} train, {he['tokens']:,} held-out) in {n} {manifest['dtype']} "
        f"shard(s) in {output}; {seconds:.1f} s, {tokens_now / max(seconds, 1e-9):,.0f} tokens/s"
    )
