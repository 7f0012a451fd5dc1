"""SentencePiece tokenizer: deterministic training, loading and a thin wrapper.

Trained models are lossless (`decode(encode(s)) == s`): identity normalisation, no dummy
prefix, whitespace kept, '\\n' as its own piece and byte fallback for unseen characters.
Ids: 0 <unk>, 1 <s> (bos), 2 </s> (eos); no pad.
"""

import io
import os
import re
from collections.abc import Iterable, Iterator, Sequence

import sentencepiece as spm

from gpn_jax.io import paths
from gpn_jax.io.files import atomic_write
from gpn_jax.io.regular import read_regular_file
from gpn_jax.io.untrusted import bad_file

_MAX_LINE_CHARS = 2048  # training lines are chopped to this (SentencePiece skips long ones)
_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")
_TOO_LOW = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


class Tokenizer:
    """A SentencePiece model with plain-Python `encode` / `decode`."""

    def __init__(self, model_proto: bytes, path: str | None = None):
        self.model_proto = model_proto
        self.path = path
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)

    @property
    def vocab_size(self) -> int:
        return self._sp.vocab_size()

    @property
    def bos_id(self) -> int:
        return self._sp.bos_id()

    @property
    def eos_id(self) -> int:
        return self._sp.eos_id()

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no bos/eos added)."""
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str], num_threads: int = 2) -> list[list[int]]:
        """Token ids of each text."""
        return self._sp.encode(list(texts), num_threads=num_threads)

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`."""
        return self._sp.decode([int(i) for i in ids])

    def id_to_piece(self, token_id: int) -> str:
        return self._sp.id_to_piece(int(token_id))

    def save(self, path: str) -> None:
        """Writes the model file atomically."""
        atomic_write(path, self.model_proto)
        self.path = path


MAX_MODEL_BYTES = 256 << 20  # a 256k-piece SentencePiece model is a few MiB


def load_tokenizer(path: str) -> Tokenizer:
    """Loads a SentencePiece `.model` file.

    Untrusted input: the file must be a regular file of at most MAX_MODEL_BYTES; the model is a
    protobuf message (data only), parsed by SentencePiece; nothing in it is executed. A file
    that is not a model is one `BadFileError` line naming it.
    """
    fix = "give a SentencePiece .model file (data.tokenizer_path) or delete this one"
    if paths.is_remote(path):
        if not paths.exists(path):
            raise ValueError(f"tokenizer file not found: {path}")
        proto = paths.read_bytes(path)
    else:
        if not os.path.exists(path):
            raise ValueError(f"tokenizer file not found: {path}")
        if not os.path.isfile(path):
            raise bad_file(path, "the tokenizer is not a regular file", fix)
        if os.path.getsize(path) > MAX_MODEL_BYTES:
            raise bad_file(path, f"over {MAX_MODEL_BYTES} bytes: not a SentencePiece model", fix)
        proto = read_regular_file(path, MAX_MODEL_BYTES)
    if not proto:
        raise bad_file(path, "an empty file is not a SentencePiece model", fix)
    try:
        tokenizer = Tokenizer(proto, path)
    except (RuntimeError, ValueError, TypeError) as e:
        raise bad_file(path, f"not a SentencePiece model ({_first_line(e)})", fix) from None
    if tokenizer.vocab_size < 1:
        raise bad_file(path, "a SentencePiece model with no pieces", fix)
    return tokenizer


def train_tokenizer(
    docs: Iterable[str],
    vocab_size: int,
    model_path: str | None = None,
    *,
    model_type: str = "unigram",
    character_coverage: float = 0.9995,
    input_sentence_size: int = 2_000_000,
    num_threads: int = 2,
    seed: int = 0,
) -> Tokenizer:
    """Trains a SentencePiece model on the lines of `docs`; saves it to `model_path` if given."""
    proto = io.BytesIO()
    spm.set_random_generator_seed(seed)
    interrupted = []  # Ctrl-C while SentencePiece reads the lines: its C++ reports an error
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_noting_interrupts(_training_lines(docs), interrupted),
            model_writer=proto,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            input_sentence_size=input_sentence_size,
            shuffle_input_sentence=True,
            num_threads=num_threads,
            byte_fallback=True,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            add_dummy_prefix=False,
            allow_whitespace_only_pieces=True,
            split_digits=True,
            user_defined_symbols=["\n"],
            max_sentence_length=4 * _MAX_LINE_CHARS + 16,
            unk_id=0,
            bos_id=1,
            eos_id=2,
            pad_id=-1,
            minloglevel=2,
        )
    except RuntimeError as e:
        if interrupted:  # the user's Ctrl-C, not a training failure
            raise KeyboardInterrupt from None
        raise ValueError(_training_error(e, vocab_size)) from None
    tokenizer = Tokenizer(proto.getvalue())
    if model_path:
        tokenizer.save(model_path)
    return tokenizer


def _noting_interrupts(lines: Iterator[str], interrupted: list) -> Iterator[str]:
    """`lines`, noting in `interrupted` a KeyboardInterrupt raised while the next is read."""
    try:
        yield from lines
    except KeyboardInterrupt:
        interrupted.append(True)
        raise


def _training_lines(docs: Iterable[str]) -> Iterator[str]:
    for doc in docs:
        for line in doc.split("\n"):
            for i in range(0, len(line), _MAX_LINE_CHARS):
                if line[i : i + _MAX_LINE_CHARS].strip():
                    yield line[i : i + _MAX_LINE_CHARS]


def _training_error(e: RuntimeError, vocab_size: int) -> str:
    text = str(e)
    if m := _TOO_HIGH.search(text):
        return (
            f"tokenizer vocab_size {vocab_size} is too large for this corpus "
            f"(at most {m.group(2)}); lower vocab_size or use more text"
        )
    if m := _TOO_LOW.search(text):
        return f"tokenizer vocab_size {vocab_size} is too small (needs at least {m.group(2)})"
    if "sentences_.empty()" in text:
        return "cannot train a tokenizer on an empty corpus"
    return f"SentencePiece training failed: {_first_line(e)}"


def check_vocab(tokenizer: Tokenizer, config_vocab_size: int) -> None:
    """Raises ValueError unless the tokenizer's vocabulary matches the model's."""
    if tokenizer.vocab_size != config_vocab_size:
        where = f" ({tokenizer.path})" if tokenizer.path else ""
        raise ValueError(
            f"tokenizer vocab {tokenizer.vocab_size} != model vocab_size {config_vocab_size}"
            f"{where}; set vocab_size={tokenizer.vocab_size} or use a matching tokenizer"
        )


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
