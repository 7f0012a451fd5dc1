"""The data pipeline's entry point: `from_config(config, ...) -> Data` (or `build(DataConfig)`).

Text sources (embedded, files, tfds): documents -> train / held-out character split ->
SentencePiece tokenizer (given, found in the workdir, or trained on the train split) ->
flat uint32 token streams (eos after each document) -> windows. `bin:` sources are
already tokens, memory-mapped: a directory written by `gpn_jax.prepare` (it has a
manifest.json) brings its own tokenizer, dtype and held-out shards; plain shards are split
by token position.
"""

import dataclasses
import hashlib
import os
from typing import Any

import numpy as np

from gpn_jax.data.bin_source import ShardedTokens, list_shards, memmap_shard, open_bin
from gpn_jax.data.masks import loss_mask  # noqa: F401 - re-exported (its former home)
from gpn_jax.data.prepare.manifest import MANIFEST, PreparedCorpus, read_prepared
from gpn_jax.data.shard_check import check_disjoint, check_ids, digest_key, scan_shards
from gpn_jax.data.sources import load_documents
from gpn_jax.data.spec import parse_spec
from gpn_jax.data.split import split_documents, split_tokens
from gpn_jax.data.stream import cached_token_stream, unigram_counts
from gpn_jax.data.tokenizer import Tokenizer, check_vocab, load_tokenizer, train_tokenizer
from gpn_jax.data.windows import WindowIterator
from gpn_jax.io import paths
from gpn_jax.io.files import atomic_write, load_cache, save_cache
from gpn_jax.io.untrusted import bad_file

TOKENIZER_FILE = "tokenizer.model"


@dataclasses.dataclass
class Data:
    """Everything the trainer needs from the data.

    Attributes:
      tokenizer: the SentencePiece tokenizer (None for `bin:` data given without one).
      train: the endless training `WindowIterator` (a Grain pipeline; this host's rows).
      train_tokens: the flat training token array (np.ndarray or memory-mapped view).
      heldout: the flat held-out token array (never read by `train`).
      unigram_counts: int64 (vocab_size,) counts of every id in `train_tokens`.
      vocab_size, seq_len, batch_size: the geometry the data was built for.
      eos_id: the document separator id (None if unknown).
      description: a human-readable summary.
      loss_mask: (seq_len,) bool positions the training loss is taken on (None: all), e.g.
        the answers of `recall:` data.
    """

    tokenizer: Tokenizer | None
    train: WindowIterator
    train_tokens: Any
    heldout: Any
    unigram_counts: np.ndarray
    vocab_size: int
    seq_len: int
    batch_size: int
    eos_id: int | None
    description: str
    process_index: int = 0
    process_count: int = 1
    loss_mask: np.ndarray | None = None

    def heldout_windows(
        self, batch_size: int | None = None, seq_len: int | None = None, layout: str = "sequential"
    ) -> WindowIterator:
        """A finite, in-order iterator over the held-out windows (this host's rows)."""
        return WindowIterator(
            self.heldout,
            batch_size or self.batch_size,
            seq_len or self.seq_len,
            layout=layout,
            repeat=False,
            process_index=self.process_index,
            process_count=self.process_count,
            name="held-out",
        )


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """What the data is, as the config says (`config.data`, `config.train`, the model's vocab).

    Attributes:
      source: 'embedded', a .txt/.jsonl path, 'tfds:NAME[/CONFIG][:VERSION][:SPLIT]', 'bin:PATH'
        or 'recall:PARAMS' (synthetic associative recall, no tokenizer; `gpn_jax.data.recall`);
        grammar in `gpn_jax.data.spec`.
      vocab_size: the model's vocabulary; the tokenizer must match it exactly (for `bin:`
        data without a tokenizer it must exceed the largest id).
      seq_len, batch_size: window length T and global batch size B.
      tokenizer_path: a SentencePiece model to use; else `<workdir>/tokenizer.model` is
        loaded if present, or trained on the train split (and saved there if workdir is set).
      heldout_fraction: the trailing fraction of the text (or tokens) held out.
      seed: the training window shuffle seed.
      data_dir: the tfds data directory (local or gs://).
      text_field: the text field of jsonl / tfds examples (default 'text').
      max_docs: read at most this many documents.
      bin_dtype: 'uint16' or 'uint32' for `bin:` shards (a prepared directory's manifest
        names its own; its held-out shards replace `heldout_fraction`'s split, and its
        tokenizer.model is used, and copied into the workdir, unless `tokenizer_path` is set).
      train_layout: 'shuffled', 'sequential' or 'streams' (see `windows`).
    """

    source: str | None
    vocab_size: int
    seq_len: int
    batch_size: int
    tokenizer_path: str | None = None
    heldout_fraction: float = 0.05
    seed: int = 0
    data_dir: str | None = None
    text_field: str | None = None
    max_docs: int | None = None
    bin_dtype: str = "uint32"
    train_layout: str = "shuffled"

    @classmethod
    def of(cls, config) -> "DataConfig":
        """The data a run config describes (the trainer's data, field for field)."""
        d, t = config.data, config.train
        return cls(
            d.source,
            vocab_size=config.model.vocab_size,
            seq_len=t.seq_len,
            batch_size=t.batch_size,
            tokenizer_path=d.tokenizer_path or None,
            heldout_fraction=d.heldout_fraction,
            seed=config.seed,
            data_dir=d.data_dir or None,
            text_field=d.text_field or None,
            bin_dtype=d.bin_dtype,
            train_layout=train_layout(config),
        )


def train_layout(config) -> str:
    """The training window order: `data.train_layout` if set; else 'streams' for stateful
    training (`train.carry_state`), in order for `bin:` data continued from another trainer's
    checkpoint (`train.init_from`, see `training.init_from`), as that trainer reads it, and
    shuffled otherwise. Fixed by the config, so a resume agrees with it."""
    explicit = config.data.train_layout
    if explicit:
        return explicit
    if config.train.carry_state:  # stateful training: one stream per batch row
        return "streams"
    continued = bool(config.train.init_from)
    return (
        "sequential" if continued and parse_spec(config.data.source).kind == "bin" else "shuffled"
    )


def from_config(config, **keywords) -> Data:
    """The data of a run config (`DataConfig.of(config)`); the keywords (workdir, cache_dir,
    train_state, process_index, process_count) as for `build`."""
    return build(DataConfig.of(config), **keywords)


@dataclasses.dataclass(frozen=True)
class Source:
    """Data read, split and tokenized, before any iterator exists (`read`): the trainer reads
    its source before it compiles anything, so a bad corpus, tokenizer or split is reported
    first, then opens the iterators with the restored position (`Source.open`)."""

    dc: DataConfig
    parts: tuple  # (tokenizer, train tokens, held-out tokens, unigram counts, description)

    def open(self, train_state: dict | None = None, process_index: int = 0,
             process_count: int = 1) -> Data:  # fmt: skip
        """The `Data` over these parts, the training iterator resumed from `train_state`."""
        hosts = dict(process_index=process_index, process_count=process_count)
        source = parse_spec(self.dc.source)
        if source.kind != "recall":
            return _assemble(self.parts, self.dc, train_state, **hosts)
        from gpn_jax.data import recall

        fresh = not recall.parse_recall_params(source.name).examples
        data = _assemble(self.parts, self.dc, None if fresh else train_state, **hosts)
        return recall.attach(data, source.name, self.dc.seed, train_state if fresh else None)


def read(dc: DataConfig, *, workdir: str | None = None, cache_dir: str | None = None) -> Source:
    """Reads what `dc` describes: documents or shards, the tokenizer (trained and saved in
    `workdir` if needed), the split and the token caches (`cache_dir` or
    `<workdir>/data_cache`). Every data error is raised here."""
    source = parse_spec(dc.source)
    if source.kind == "recall":
        from gpn_jax.data import recall

        return Source(dc, recall.recall_parts(source.name, dc.vocab_size, dc.seq_len,
                                              dc.batch_size))  # fmt: skip
    if cache_dir is None and workdir:
        cache_dir = paths.join(workdir, "data_cache")
    if source.kind == "bin":
        prepared = read_prepared(source.path)
        if prepared:
            parts = _prepared_parts(
                prepared, dc.tokenizer_path, dc.vocab_size, dc.heldout_fraction, cache_dir, workdir
            )
            if prepared.heldout and dc.heldout_fraction > 0:
                _check_prepared_heldout(parts[2], dc, prepared.directory)
        else:
            parts = _bin_parts(
                source.path,
                dc.bin_dtype,
                dc.tokenizer_path,
                dc.vocab_size,
                dc.heldout_fraction,
                cache_dir,
            )
    else:
        read_fields = dict(data_dir=dc.data_dir, text_field=dc.text_field, max_docs=dc.max_docs)
        parts = _text_parts(
            source,
            dc.vocab_size,
            dc.tokenizer_path,
            dc.heldout_fraction,
            workdir,
            cache_dir,
            **read_fields,
        )
    return Source(dc, parts)


def build(
    dc: DataConfig,
    *,
    workdir: str | None = None,
    cache_dir: str | None = None,
    train_state: dict | None = None,
    process_index: int = 0,
    process_count: int = 1,
) -> Data:
    """Builds the data `dc` describes: `read(dc, ...).open(train_state, ...)`.

    Args:
      dc: what to read and how to window it.
      workdir: where the tokenizer is kept; caches go to `cache_dir` or `<workdir>/data_cache`.
      cache_dir: the token / count cache directory.
      train_state: a `WindowIterator.get_state()` dict to resume from.
      process_index, process_count: this host and the host count (each reads B/count rows).
    """
    source = read(dc, workdir=workdir, cache_dir=cache_dir)
    return source.open(train_state, process_index=process_index, process_count=process_count)


def build_data(
    spec: str | None = "embedded",
    *,
    workdir: str | None = None,
    cache_dir: str | None = None,
    train_state: dict | None = None,
    process_index: int = 0,
    process_count: int = 1,
    **fields,
) -> Data:
    """`build(DataConfig(spec, **fields), ...)`: the data from keyword fields (tests, notebooks)."""
    return build(
        DataConfig(spec, **fields),
        workdir=workdir,
        cache_dir=cache_dir,
        train_state=train_state,
        process_index=process_index,
        process_count=process_count,
    )


def _text_parts(source, vocab_size, tokenizer_path, heldout_fraction, workdir, cache_dir, **read):
    docs, what = load_documents(source, **read)
    train_docs, heldout_docs = split_documents(docs, heldout_fraction)
    if not train_docs:
        raise ValueError(f"no training text left after holding out {heldout_fraction} of {what}")
    tokenizer, how = resolve_tokenizer(train_docs, vocab_size, tokenizer_path, workdir)
    check_vocab(tokenizer, vocab_size)
    train = cached_token_stream(train_docs, tokenizer, cache_dir, "train")
    heldout = cached_token_stream(heldout_docs, tokenizer, cache_dir, "heldout")
    return tokenizer, train, heldout, unigram_counts(train, vocab_size), f"{what}; tokenizer {how}"


def resolve_tokenizer(train_docs, vocab_size, tokenizer_path, workdir) -> tuple[Tokenizer, str]:
    """The given tokenizer, else the workdir's, else a new one trained on `train_docs`."""
    if tokenizer_path:
        return load_tokenizer(tokenizer_path), tokenizer_path
    saved = paths.join(workdir, TOKENIZER_FILE) if workdir else None
    if saved and paths.exists(saved):
        return load_tokenizer(saved), saved
    tokenizer = train_tokenizer(train_docs, vocab_size, saved)
    return tokenizer, f"trained (vocab {vocab_size}){' -> ' + saved if saved else ''}"


def _bin_parts(path, bin_dtype, tokenizer_path, vocab_size, heldout_fraction, cache_dir):
    tokens = open_bin(path, bin_dtype)
    if not len(tokens):
        raise ValueError(f"empty corpus: the .bin shards in {path} hold no tokens")
    cut = split_tokens(len(tokens), heldout_fraction)
    train, heldout = tokens.view(0, cut), tokens.view(cut, len(tokens))
    tokenizer = load_tokenizer(tokenizer_path) if tokenizer_path else None
    if tokenizer:
        check_vocab(tokenizer, vocab_size)
    shards = list_shards(path)
    scans = scan_shards(shards, [memmap_shard(p, np.dtype(bin_dtype)) for p in shards])
    check_ids(scans, vocab_size)  # every load: the counts below may come from the cache
    counts = _bin_counts(scans, train, vocab_size, cache_dir, (0, cut))
    what = f"{path}: {len(shards)} {bin_dtype} shard(s), {len(tokens):,} tokens"
    return tokenizer, train, heldout, counts, f"{what}; tokenizer {tokenizer_path or 'none'}"


def _prepared_parts(prepared: PreparedCorpus, tokenizer_path, vocab_size, fraction, cache, workdir):
    """A `gpn_jax.prepare` directory: its train shards, its held-out shards (if it has
    any; else the trailing `heldout_fraction` of the train tokens) and its tokenizer."""
    tokenizer = load_tokenizer(tokenizer_path or prepared.tokenizer_path)
    if hashlib.sha256(tokenizer.model_proto).hexdigest() != prepared.tokenizer_sha256:
        raise ValueError(
            f"tokenizer {tokenizer.path} is not the one {prepared.directory} was prepared with"
        )
    check_vocab(tokenizer, vocab_size)
    if workdir and not tokenizer_path:
        _adopt_tokenizer(tokenizer, workdir, prepared.directory)
    dtype = np.dtype(prepared.dtype)
    train_maps = [memmap_shard(p, dtype) for p in prepared.train]
    heldout_maps = [memmap_shard(p, dtype) for p in prepared.heldout]
    scans = scan_shards(prepared.train + prepared.heldout, train_maps + heldout_maps)
    check_ids(scans, vocab_size)  # every load: the counts below may come from the cache
    manifest = os.path.join(prepared.directory, MANIFEST)
    check_disjoint(manifest, scans[: len(train_maps)], scans[len(train_maps) :])
    train, heldout = ShardedTokens(train_maps), ShardedTokens(heldout_maps)
    if not len(train):
        raise ValueError(f"empty corpus: {prepared.directory} holds no training tokens")
    if not len(heldout):  # prepared without held-out documents: split by position
        cut = split_tokens(len(train), fraction)
        train, heldout = train.view(0, cut), train.view(cut, len(train))
    counts = _bin_counts(scans, train, vocab_size, cache, ("train", len(train)))
    what = (
        f"{prepared.directory}: prepared, {len(prepared.train)} train + "
        f"{len(prepared.heldout)} held-out {prepared.dtype} shard(s), "
        f"{len(train) + len(heldout):,} tokens"
    )
    return tokenizer, train, heldout, counts, f"{what}; tokenizer {tokenizer.path}"


def _adopt_tokenizer(tokenizer: Tokenizer, workdir: str, corpus: str) -> None:
    """Copies the corpus's tokenizer into the workdir, where evaluation and generation look."""
    saved = paths.join(workdir, TOKENIZER_FILE)
    if not paths.exists(saved):
        atomic_write(saved, tokenizer.model_proto)
        return
    if paths.read_bytes(saved) != tokenizer.model_proto:
        raise ValueError(
            f"{saved} is not the tokenizer of {corpus}; use a fresh workdir for this corpus"
        )


def _bin_counts(scans, tokens, vocab_size, cache_dir, span) -> np.ndarray:
    """Unigram counts of `tokens`, cached under a key of the shards' content digests."""
    if not cache_dir:
        return unigram_counts(tokens, vocab_size)
    key = digest_key(scans, span, vocab_size, str(tokens.dtype))
    file = paths.join(cache_dir, f"counts-{key}.npy")

    def of_vocabulary(counts) -> None:
        if counts.shape != (vocab_size,):
            raise bad_file(file, f"{counts.shape[0]} counts for vocab_size {vocab_size}",
                           "delete this cache file (it is rebuilt on the next run)")  # fmt: skip

    counts = load_cache(file, "int64", check=of_vocabulary)
    if counts is None:
        counts = unigram_counts(tokens, vocab_size)
        save_cache(file, counts)
    return counts


def _assemble(parts, dc: DataConfig, state, process_index, process_count) -> Data:
    tokenizer, train_tokens, heldout, counts, what = parts
    B, T = dc.batch_size, dc.seq_len
    hosts = dict(process_index=process_index, process_count=process_count)
    train = WindowIterator(train_tokens, B, T, seed=dc.seed, layout=dc.train_layout, **hosts)
    if state is not None:
        train.set_state(state)
    eos = tokenizer.eos_id if tokenizer else None
    data = Data(
        tokenizer, train, train_tokens, heldout, counts, dc.vocab_size, T, B, eos, "", **hosts
    )
    if dc.heldout_fraction > 0:
        _check_heldout(heldout, B, T, dc.heldout_fraction)
    data.description = (
        f"{what}; train {len(train_tokens):,} tokens ({train.steps_per_epoch} steps/epoch of "
        f"({B}, {T})), held-out {len(heldout):,} tokens"
    )
    return data


def _check_heldout(heldout, batch_size, seq_len, heldout_fraction) -> None:
    if len(heldout) < batch_size * seq_len:
        raise ValueError(
            f"held-out split too small: {len(heldout)} tokens available, one ({batch_size}, "
            f"{seq_len}) batch needs {batch_size * seq_len}; raise config.data.heldout_fraction "
            f"({heldout_fraction}), use more data, or set config.data.heldout_fraction=0"
        )


def _check_prepared_heldout(heldout, dc: DataConfig, corpus: str) -> None:
    """A prepared corpus's held-out shards are cut by `gpn-prepare --heldout_fraction`; the
    training config's `heldout_fraction` does not apply to them, so the fix is named there."""
    need = dc.batch_size * dc.seq_len
    if len(heldout) < need:
        raise ValueError(
            f"held-out split of {corpus} too small: {len(heldout)} tokens, one "
            f"({dc.batch_size}, {dc.seq_len}) batch needs {need}; re-run gpn-prepare with a "
            "larger --heldout_fraction (config.data.heldout_fraction does not apply to a "
            "prepared corpus), or set config.data.heldout_fraction=0 to skip this check"
        )
