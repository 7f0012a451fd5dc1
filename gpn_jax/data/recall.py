"""Multi-query associative recall (MQAR-style) synthetic data: key-value pairs, then queries.

One example is exactly `seq_len` tokens::

    k_1 v_1 k_2 v_2 ... k_N v_N   q_1 a_1 q_2 a_2 ... q_Q a_Q   [pad]

The N keys are distinct ids from the key range; each value is drawn independently (with
replacement) from the value range; the queries go through all N keys in a random order
(again in a fresh order if Q > N) and each answer a_j is the value paired with q_j.
Q = (seq_len - 2N) // 2; an odd leftover token is padding. Only the answers are
predictable from the context; everything else is uniform noise (keys, values, query keys)
or fixed (padding).

Ids: 0 pad, 1 bos, 2 eos (reserved, as the text tokenizer's), keys [3, 3 + keys),
values [3 + keys, 3 + keys + values). Everything is a deterministic function of the seed.

As a data spec (`gpn_jax.data.spec`): `recall:pairs=8,keys=32,values=32,examples=20000,
heldout=512,seed=0,targets=answers` (any subset; the rest default). Training windows are the
examples (`seq_len` = the example length), held-out windows an independently seeded set.

Training targets, as in the standard MQAR protocol (Zoology; the Gated DeltaNet paper's
synthetic): `targets=answers` (the default) puts the training loss on the answer positions
only -- the one part of the sequence that is predictable -- through `Data.loss_mask`;
`targets=all` trains on every position with the plain LM loss. `examples=0` draws fresh
examples for every training step (`FreshRecallIterator`) instead of cycling a fixed set.
"""

import dataclasses

import numpy as np

PAD, BOS, EOS = 0, 1, 2
FIRST_KEY = 3
TARGETS = ("answers", "all")


@dataclasses.dataclass(frozen=True)
class RecallSpec:
    """Shape of the recall task and its data sizes."""

    pairs: int = 8  # key-value pairs N per example
    keys: int = 32  # size of the key range
    values: int = 32  # size of the value range
    examples: int = 20_000  # training examples (0: fresh examples every step)
    heldout: int = 512  # held-out examples
    seed: int = 0
    targets: str = "answers"  # training loss positions: 'answers' or 'all'

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if f.name == "targets":
                continue
            v = getattr(self, f.name)
            zero_ok = f.name in ("seed", "heldout", "examples")
            if not isinstance(v, int) or (v < 0 if zero_ok else v < 1):
                raise ValueError(f"recall {f.name} must be a positive integer, got {v!r}")
        if self.targets not in TARGETS:
            raise ValueError(f"recall targets must be one of {TARGETS}, got {self.targets!r}")
        if self.pairs > self.keys:
            raise ValueError(
                f"recall needs pairs <= keys (distinct keys), got {self.pairs} > {self.keys}"
            )

    @property
    def vocab_needed(self) -> int:
        """The smallest vocabulary holding every id."""
        return FIRST_KEY + self.keys + self.values

    def params(self) -> str:
        """The spec string's parameter part (round-trips through `parse_recall_params`)."""
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))


def parse_recall_params(text: str) -> RecallSpec:
    """'pairs=8,keys=32,targets=all' -> RecallSpec (unset fields keep their defaults)."""
    known = {f.name for f in dataclasses.fields(RecallSpec)}
    fields = {}
    for item in filter(None, (s.strip() for s in (text or "").split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in known:
            raise ValueError(
                f"bad recall parameter {item!r}; expected name=int with name in {sorted(known)}"
            )
        if name == "targets":
            fields[name] = value.strip()
            continue
        try:
            fields[name] = int(value)
        except ValueError:
            raise ValueError(f"recall parameter {name} must be an integer, got {value!r}") from None
    return RecallSpec(**fields)


def num_queries(spec: RecallSpec, seq_len: int) -> int:
    q = (seq_len - 2 * spec.pairs) // 2
    if q < 1:
        raise ValueError(
            f"seq_len {seq_len} leaves no room for a query after {spec.pairs} key-value pairs "
            f"(needs >= {2 * spec.pairs + 2})"
        )
    return q


def make_examples(spec: RecallSpec, n: int, seq_len: int, stream: int | tuple = 0):
    """`n` examples as (tokens (n, seq_len) int32, answer mask (n, seq_len) bool).

    `stream` picks an independent random stream (0 training, 1 held-out, (2, seed, step)
    the fresh examples of a training step).
    """
    N, Q = spec.pairs, num_queries(spec, seq_len)
    rng = np.random.default_rng([spec.seed, *np.atleast_1d(stream).tolist()])
    keys = np.argsort(rng.random((n, spec.keys)), axis=1)[:, :N]  # distinct per example
    values = rng.integers(0, spec.values, (n, N))
    rounds = -(-Q // N)
    order = np.concatenate([np.argsort(rng.random((n, N)), axis=1) for _ in range(rounds)], axis=1)[
        :, :Q
    ]
    q_keys = np.take_along_axis(keys, order, axis=1)
    answers = np.take_along_axis(values, order, axis=1)
    tokens = np.full((n, seq_len), PAD, np.int32)
    tokens[:, 0 : 2 * N : 2] = FIRST_KEY + keys
    tokens[:, 1 : 2 * N : 2] = FIRST_KEY + spec.keys + values
    end = 2 * N + 2 * Q
    tokens[:, 2 * N : end : 2] = FIRST_KEY + q_keys
    tokens[:, 2 * N + 1 : end : 2] = FIRST_KEY + spec.keys + answers
    mask = np.zeros((n, seq_len), bool)
    mask[:, 2 * N + 1 : end : 2] = True
    return tokens, mask


def heldout_examples(spec: RecallSpec, seq_len: int, n: int | None = None):
    """The held-out examples (the ones `recall_parts` holds out): (tokens, answer mask)."""
    return make_examples(spec, spec.heldout if n is None else n, seq_len, stream=1)


def answer_mask(spec: RecallSpec, seq_len: int) -> np.ndarray:
    """(seq_len,) bool: the answer positions (the same in every example of this layout)."""
    return make_examples(spec, 1, seq_len)[1][0]


def loss_mask(spec: RecallSpec, seq_len: int) -> np.ndarray | None:
    """The training loss mask `targets` asks for (None: every position)."""
    return answer_mask(spec, seq_len) if spec.targets == "answers" else None


def recall_parts(params: str, vocab_size: int, seq_len: int, batch_size: int = 1):
    """`build_data`'s parts for a `recall:` spec: (None, train, held-out, counts, description).

    Both token arrays are flat uint32, one example per `seq_len` tokens. With `examples=0`
    the train array is one batch of step-0 fresh examples (for the unigram counts and the
    geometry checks); `attach` then swaps in the endless fresh-example iterator.
    """
    spec = parse_recall_params(params)
    if spec.vocab_needed > vocab_size:
        raise ValueError(
            f"recall data needs vocab_size >= {spec.vocab_needed} "
            f"(3 reserved + {spec.keys} keys + {spec.values} values), got {vocab_size}"
        )
    if spec.examples:
        train, _ = make_examples(spec, spec.examples, seq_len, stream=0)
    else:
        train, _ = make_examples(spec, batch_size, seq_len, stream=(2, 0, 0))
    heldout, _ = heldout_examples(spec, seq_len)
    train, heldout = train.reshape(-1).astype(np.uint32), heldout.reshape(-1).astype(np.uint32)
    counts = np.bincount(train, minlength=vocab_size).astype(np.int64)
    what = (
        f"recall ({spec.params()}): {num_queries(spec, seq_len)} queries per {seq_len}-token "
        f"example, loss on {spec.targets}, "
        f"{'fresh examples every step' if not spec.examples else 'a fixed example set'}; "
        "no tokenizer"
    )
    return None, train, heldout, counts, what


class FreshRecallIterator:
    """Endless training batches of new examples (`examples=0`): batch `step` is a pure
    function of (spec seed, iterator seed, step), so a resumed run sees the same data.
    Same interface as `WindowIterator` (next / get_state / set_state / host rows), but its
    own generator rather than a Grain pipeline: the examples are synthesised per step, there
    is nothing to read (a fixed example set, `examples>0`, goes through Grain like any text).
    Its state is checkpointed through Grain's orbax handler all the same."""

    def __init__(self, spec: RecallSpec, batch_size, seq_len, seed=0, process_index=0,
                 process_count=1):  # fmt: skip
        self.spec, self.batch_size, self.seq_len, self.seed = spec, batch_size, seq_len, seed
        self.process_index, self.process_count = process_index, process_count
        self.step, self.steps_per_epoch, self.repeat = 0, 1, True

    def __iter__(self):
        return self

    def __next__(self) -> np.ndarray:
        batch = self.batch_at(self.step)
        self.step += 1
        return batch

    def batch_at(self, step: int) -> np.ndarray:
        tokens, _ = make_examples(self.spec, self.batch_size, self.seq_len, (2, self.seed, step))
        per_host = self.batch_size // self.process_count
        return tokens[self.process_index * per_host : (self.process_index + 1) * per_host]

    def get_state(self) -> dict:
        return {"layout": "fresh", "step": self.step, "seed": self.seed,
                "batch_size": self.batch_size, "seq_len": self.seq_len}  # fmt: skip

    def set_state(self, state: dict) -> None:
        mine = self.get_state()
        keys = ("layout", "batch_size", "seq_len")
        bad = [f"{k} {state.get(k)!r} != {mine[k]!r}" for k in keys if state.get(k) != mine[k]]
        if bad:
            raise ValueError(f"saved data state does not fit this data: {', '.join(bad)}")
        self.seed, self.step = int(state["seed"]), int(state["step"])


def attach(data, params: str, seed: int = 0, train_state: dict | None = None):
    """Adds the recall-specific parts to a built `Data`: the training loss mask and, with
    `examples=0`, the fresh-example iterator (resumed from `train_state`)."""
    spec = parse_recall_params(params)
    data.loss_mask = loss_mask(spec, data.seq_len)
    if not spec.examples:
        it = FreshRecallIterator(spec, data.batch_size, data.seq_len, seed,
                                 data.process_index, data.process_count)  # fmt: skip
        if train_state is not None:
            it.set_state(train_state)
        data.train = it
    return data
