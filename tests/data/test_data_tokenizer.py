"""SentencePiece training / loading, lossless round trip, vocabulary checks."""

import pytest

from gpn_jax.data.text_sources import embedded_corpus
from gpn_jax.data.tokenizer import check_vocab, load_tokenizer, train_tokenizer

SMALL = ["the quick brown fox jumps over the lazy dog\n" * 3, "a second short document"]


@pytest.fixture(scope="module")
def embedded_tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.model"
    return train_tokenizer(embedded_corpus(), 2048, str(path))


def test_round_trip_on_embedded_corpus(embedded_tokenizer):
    tok = embedded_tokenizer
    assert tok.vocab_size == 2048 and (tok.bos_id, tok.eos_id) == (1, 2)
    docs = embedded_corpus()
    for doc in docs[::8]:
        ids = tok.encode(doc)
        assert all(0 <= i < 2048 for i in ids) and tok.decode(ids) == doc
    assert len(tok.encode(docs[0])) < len(docs[0]) / 2.5  # real subword compression
    for text in ["  two  spaces\n\n\ttab", "ünïcödé 日本語 🙂"]:  # byte fallback: lossless
        assert tok.decode(tok.encode(text)) == text
    assert tok.id_to_piece(tok.encode("\n")[0]) == "\n"


def test_training_is_deterministic_and_model_reloads(embedded_tokenizer, tmp_path):
    again = train_tokenizer(embedded_corpus(), 2048)
    assert again.model_proto == embedded_tokenizer.model_proto
    loaded = load_tokenizer(embedded_tokenizer.path)
    text = embedded_corpus()[3][:500]
    assert loaded.encode(text) == embedded_tokenizer.encode(text)
    with pytest.raises(ValueError, match="tokenizer file not found"):
        load_tokenizer(str(tmp_path / "missing.model"))


def test_check_vocab_mismatch_is_one_line(embedded_tokenizer):
    check_vocab(embedded_tokenizer, 2048)
    with pytest.raises(ValueError, match="tokenizer vocab 2048 != model vocab_size 4096") as e:
        check_vocab(embedded_tokenizer, 4096)
    assert "\n" not in str(e.value)


def test_vocab_too_large_or_small_or_empty_corpus():
    with pytest.raises(
        ValueError, match=r"vocab_size 50000 is too large for this corpus \(at most \d+\)"
    ):
        train_tokenizer(SMALL, 50000)
    with pytest.raises(ValueError, match="too small"):
        train_tokenizer(SMALL, 100)
    with pytest.raises(ValueError, match="empty corpus"):
        train_tokenizer(["", "  "], 300)


def test_ctrl_c_while_sentencepiece_reads_the_lines_is_an_interrupt_not_a_training_failure():
    """SentencePiece's C++ reports a KeyboardInterrupt raised in the line iterator as its own
    RuntimeError ("INTERNAL: KeyboardInterrupt"): the user's Ctrl-C must stay one (the commands
    then exit 130 with `interrupted`), not become "SentencePiece training failed" (exit 1)."""
    import os
    import signal

    def docs():
        for i in range(100_000):
            if i == 500:
                os.kill(os.getpid(), signal.SIGINT)
            yield f"document {i} with a few words in it " * 3

    with pytest.raises(KeyboardInterrupt):
        train_tokenizer(docs(), 256)
