"""LAMBADA: harness-style split, both protocols checked against a direct per-example computation."""

import functools
import json
import math

import jax
import numpy as np
import pytest

from gpn_jax.data.text_sources import embedded_corpus
from gpn_jax.data.tokenizer import train_tokenizer
from gpn_jax.eval import lambada
from gpn_jax.models import factory
from tests.tolerance import f32_bound, rel_err

V = 512

TEXTS = [  # 4 distinct lengths (each compiles once in the direct computation)
    "The interpreter reads the file and then executes every statement",
    "A dictionary maps hashable keys to arbitrary values",
    "x y",
    "The with statement wraps the execution of a block with methods defined by a context manager",
    "A dictionary maps hashable keys to arbitrary values",
]


@functools.lru_cache(maxsize=1)
def tokenizer():
    return train_tokenizer(embedded_corpus(), V)


def models():
    gpn_m = dict(family="gpn", vocab_size=V, d_model=32, d_emb=16, d_ffn=64, n_heads=2,
                 d_key=8, d_value=8, loss_chunk=16)  # fmt: skip
    gpn = gpn_m | dict(memory=False, n_heads=0, d_key=0, d_value=0)
    tf = dict(family="transformer", vocab_size=V, d_model=32, n_layers=1, n_heads=2,
              d_ffn=64, max_seq_len=64, loss_chunk=16)  # fmt: skip
    return {"gpn_m": gpn_m, "gpn": gpn, "transformer": tf}


def write_jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


def direct(model, params, tok, ex):
    """Batch 1, no padding: (CE of each target token, greedy-correct flags)."""
    context, target = lambada.encode_example(tok, ex)
    tokens = np.asarray([context + target], np.int32)
    logits, _ = jax.jit(model.logits)(params, tokens)
    logp = np.asarray(jax.nn.log_softmax(np.asarray(logits[0], np.float64)))
    pos = range(len(context), tokens.shape[1])
    ce = np.array([-logp[t, tokens[0, t]] for t in pos])
    correct = np.array([np.argmax(logp[t]) == tokens[0, t] for t in pos])
    return ce, correct


def test_split_moves_the_space_to_the_target():
    assert lambada.split_text("a b  c") == ("a b ", " c")
    ex = lambada.Example(1, *lambada.split_text("The file is executed"))
    tok = tokenizer()
    context, target = lambada.encode_example(tok, ex)
    whole = tok.encode("The file is executed")
    assert context == tok.encode("The file is")
    assert target == whole[len(context) :] and tok.decode(target) == " executed"


@pytest.mark.parametrize("name", ["gpn_m", "transformer"])
def test_both_protocols_match_direct_per_example_computation(name, tmp_path):
    model = factory.build_model(models()[name])
    params = model.init(jax.random.PRNGKey(3))
    tok = tokenizer()
    path = write_jsonl(tmp_path / "l.jsonl", TEXTS)
    examples = lambada.read_lambada(path)
    rows = [direct(model, params, tok, ex) for ex in examples]
    # batches of 3 with varied lengths: right padding and dummy rows in the last batch
    enc = lambada.encode_all(tok, examples)
    # batched and padded vs one unpadded row: the same ops, their sums in another order. Each
    # target's CE follows up to 64 positions of reductions no longer than d_ffn = 64, then the
    # V-way logsumexp (x1: the chain's length is already the worst case)
    bound = f32_bound(64 * 64 + V, 1)
    for (ce, correct), got in zip(rows, lambada.score_encoded(model, params, enc, 3), strict=True):
        assert rel_err(got["ce"], ce) <= bound  # relative to the norm
        np.testing.assert_array_equal(got["correct"], correct)
    got = lambada.evaluate_lambada(model, params, tok, path, batch_size=3)
    ce_all = np.concatenate([ce for ce, _ in rows])
    assert got["n"] == len(TEXTS) and got["target_tokens"] == len(ce_all)
    assert got["paper"]["acc"] == np.mean([c[0] for _, c in rows])
    assert got["harness"]["acc"] == np.mean([c.all() for _, c in rows])
    # exp of a mean CE: relative error = the mean's absolute error, <= its size x `bound`
    want = math.exp(ce_all.mean())
    assert rel_err(got["paper"]["ppl"], want) <= ce_all.mean() * bound
    sums = [ce.sum() for ce, _ in rows]
    want = math.exp(np.mean(sums))
    assert rel_err(got["harness"]["ppl"], want) <= np.mean(sums) * bound


def test_greedy_accuracy_of_a_model_that_knows_the_answer():
    """Fake model: logits put all mass on the true token at every position -> acc 1, ppl 1."""

    class Oracle:
        class config:  # noqa: N801
            pass

        def __init__(self, vocab):
            self.vocab = vocab

        def logits(self, params, tokens):
            return jax.nn.one_hot(tokens, self.vocab) * 100.0, None

    tok = tokenizer()
    examples = [lambada.Example(1, *lambada.split_text(t)) for t in TEXTS]
    r = lambada.evaluate_lambada(Oracle(V), None, tok, examples, batch_size=2)
    assert r["paper"]["acc"] == r["harness"]["acc"] == 1.0
    assert r["paper"]["ppl"] == pytest.approx(1.0) and r["harness"]["ppl"] == pytest.approx(1.0)


def test_transformer_inputs_are_truncated_on_the_left():
    tok = tokenizer()
    examples = [lambada.Example(1, *lambada.split_text(TEXTS[3]))]
    enc = lambada.encode_all(tok, examples, max_len=8)[0]
    context, target = lambada.encode_example(tok, examples[0])
    assert enc.truncated and list(enc.tokens) == (context + target)[-8:]
    assert enc.n_target == len(target)


@pytest.mark.parametrize(
    "content, match",
    [
        ('{"text": "a b"}\n{"text": "c d"\n', "line 2: not valid JSON"),
        ('{"text": "a b"}\n\n{"txt": "c d"}\n', 'line 3: expected an object with a string "text"'),
        ('{"text": "oneword"}\n', "line 1: the text has no space-separated last word"),
        ('{"text": "ends with space "}\n', "line 1: the text has no space"),
        ("", "is empty"),
        ("\n  \n", "is empty"),
    ],
)
def test_malformed_files_name_the_line(tmp_path, content, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        lambada.read_lambada(str(path))


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="LAMBADA file not found"):
        lambada.read_lambada(str(tmp_path / "nope.jsonl"))
