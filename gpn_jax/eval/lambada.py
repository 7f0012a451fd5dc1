"""LAMBADA (EleutherAI `lambada_openai` jsonl: one {"text": ...} per line), two protocols.

Split as lm-evaluation-harness does: context = the text up to its last space (exclusive),
continuation = " " + the last word; whole = encode(context + continuation),
context_enc = encode(context), target = whole[len(context_enc):]; the model reads
context_enc + target.

* paper:   acc = the top-1 prediction of the target's FIRST sub-word is right;
           ppl = exp(mean CE over all target sub-words, pooled over the examples).
* harness: acc = greedy decoding reproduces EVERY target sub-word;
           ppl = exp(-mean over examples of the summed target log-likelihood).

Caveat: with a tokenizer that has a bare-space piece (this repo's SentencePiece keeps
whitespace pieces), the first target sub-word is often just " ", which inflates the paper's
accuracy; the harness's every-sub-word accuracy is immune to that.

Batching is exact: examples are right-padded, and since position t depends only on tokens
< t (every model family), positions before an example's length never see its padding;
only those positions are read. Inputs longer than the model's window (`max_seq_len`,
Transformer++) keep their last tokens, as the harness truncates on the left.
"""

import dataclasses
import functools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gpn_jax.io.regular import MAX_TEXT_BYTES, bounded_lines, open_regular


@dataclasses.dataclass(frozen=True)
class Example:
    line: int  # 1-based line in the file
    context: str
    continuation: str  # " " + the last word


def split_text(text: str) -> tuple[str, str]:
    """(context, continuation) with the harness's rule: the space goes to the continuation."""
    context, sep, word = text.rpartition(" ")
    if not sep or not word:
        raise ValueError("the text has no space-separated last word")
    return context, " " + word


def read_lambada(path: str) -> list[Example]:
    """Parses a lambada_openai jsonl file; errors name the file and the 1-based line."""
    examples = []
    try:
        f, _ = open_regular(path, MAX_TEXT_BYTES)  # no FIFO, device or huge file
    except FileNotFoundError:
        raise FileNotFoundError(f"LAMBADA file not found: {path}") from None
    except IsADirectoryError:
        raise ValueError(f"LAMBADA path is a directory, not a jsonl file: {path}") from None
    with f:
        for i, line in enumerate(bounded_lines(f, path), 1):
            if not line.strip():
                continue
            try:  # safe on untrusted files: json builds only plain data
                record = json.loads(line.decode("utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
                msg = getattr(e, "msg", None) or getattr(e, "reason", "nested too deeply")
                raise ValueError(f"{path} line {i}: not valid JSON ({msg})") from None
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise ValueError(f'{path} line {i}: expected an object with a string "text" field')
            try:
                examples.append(Example(i, *split_text(text)))
            except ValueError as e:
                raise ValueError(f"{path} line {i}: {e}") from None
    if not examples:
        raise ValueError(f"{path} is empty: no LAMBADA examples")
    return examples


def encode_example(tokenizer, ex: Example) -> tuple[list[int], list[int]]:
    """(context tokens, target tokens) split as lm-evaluation-harness does."""
    whole = tokenizer.encode(ex.context + ex.continuation)
    context_enc = tokenizer.encode(ex.context)
    target = whole[len(context_enc) :]
    if not target:
        raise ValueError(f"line {ex.line}: the target {ex.continuation!r} encodes to no tokens")
    return context_enc, target


@dataclasses.dataclass
class Encoded:
    tokens: np.ndarray  # int32 (L,): what the model reads (context + target, maybe truncated)
    n_target: int  # the last n_target tokens are the target
    truncated: bool


def encode_all(tokenizer, examples, max_len: int | None = None) -> list[Encoded]:
    out = []
    for ex in examples:
        context, target = encode_example(tokenizer, ex)
        tokens = context + target
        cut = max_len is not None and len(tokens) > max_len
        if cut:
            tokens = tokens[-max_len:]
        out.append(Encoded(np.asarray(tokens, np.int32), min(len(target), len(tokens)), cut))
    return out


@functools.lru_cache(maxsize=8)
def _scorer(model):
    """Jitted (params, tokens) -> (CE, argmax-correct), both (B, L); one per model object."""

    def score(params, tokens_BxL):
        logits, _ = model.logits(params, tokens_BxL)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), tokens_BxL)
        return ce, jnp.argmax(logits, axis=-1) == tokens_BxL

    return jax.jit(score)


def _padded_len(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def score_encoded(
    model, params, encoded: list[Encoded], batch_size: int = 16, pad_multiple: int = 32
) -> list[dict]:
    """Per-example target CE (float64 array) and greedy-correct flags (bool array).

    Examples are sorted by length into right-padded (batch_size, L) batches, L a multiple of
    `pad_multiple` (few shapes to compile); the last batch is filled with dummy rows.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    score = _scorer(model)
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].tokens))
    results: list[dict | None] = [None] * len(encoded)
    for lo in range(0, len(order), batch_size):
        idx = order[lo : lo + batch_size]
        L = _padded_len(max(len(encoded[i].tokens) for i in idx), pad_multiple)
        batch = np.zeros((batch_size, L), np.int32)
        for r, i in enumerate(idx):
            batch[r, : len(encoded[i].tokens)] = encoded[i].tokens
        ce, correct = jax.device_get(score(params, batch))
        for r, i in enumerate(idx):
            n, k = len(encoded[i].tokens), encoded[i].n_target
            results[i] = {
                "ce": np.asarray(ce[r, n - k : n], np.float64),
                "correct": np.asarray(correct[r, n - k : n], bool),
            }
    return results


def summarize(per_example: list[dict], n_truncated: int = 0) -> dict:
    """Both protocols' accuracy and PPL from per-example target CE / greedy flags."""
    n = len(per_example)
    sums = np.array([r["ce"].sum() for r in per_example])
    n_tokens = sum(len(r["ce"]) for r in per_example)
    return {
        "paper": {
            "acc": float(np.mean([r["correct"][0] for r in per_example])),
            "ppl": math.exp(sums.sum() / n_tokens),
        },
        "harness": {
            "acc": float(np.mean([r["correct"].all() for r in per_example])),
            "ppl": math.exp(sums.mean()),
        },
        "n": n,
        "target_tokens": int(n_tokens),
        "truncated": int(n_truncated),
    }


def evaluate_lambada(
    model,
    params,
    tokenizer,
    examples: list[Example] | str,
    batch_size: int = 16,
) -> dict:
    """LAMBADA results {'paper': {acc, ppl}, 'harness': {acc, ppl}, 'n', ...}.

    Args:
      examples: parsed examples or the path of a lambada_openai jsonl file; an input longer
        than the model's `max_seq_len` (if it has one) keeps its last tokens.
    """
    if isinstance(examples, str):
        examples = read_lambada(examples)
    encoded = encode_all(tokenizer, examples, getattr(model.config, "max_seq_len", None))
    per_example = score_encoded(model, params, encoded, batch_size)
    return summarize(per_example, sum(e.truncated for e in encoded))
