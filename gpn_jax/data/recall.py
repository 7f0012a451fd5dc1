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
heldout=512,seed=0` (any subset; the rest default). Training windows are the examples
(`seq_len` = the example length), held-out windows an independently seeded set.
"""

import dataclasses

import numpy as np

PAD, BOS, EOS = 0, 1, 2
FIRST_KEY = 3


@dataclasses.dataclass(frozen=True)
class RecallSpec:
    """Shape of the recall task and its data sizes."""

    pairs: int = 8  # key-value pairs N per example
    keys: int = 32  # size of the key range
    values: int = 32  # size of the value range
    examples: int = 20_000  # training examples
    heldout: int = 512  # held-out examples
    seed: int = 0

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int) or (v < 0 if f.name in ("seed", "heldout") else v < 1):
                raise ValueError(f"recall {f.name} must be a positive integer, got {v!r}")
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
    """'pairs=8,keys=32' -> RecallSpec (unset fields keep their defaults)."""
    known = {f.name for f in dataclasses.fields(RecallSpec)}
    fields = {}
    for item in filter(None, (s.strip() for s in (text or "").split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in known:
            raise ValueError(
                f"bad recall parameter {item!r}; expected name=int with name in {sorted(known)}"
            )
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


def make_examples(spec: RecallSpec, n: int, seq_len: int, stream: int = 0):
    """`n` examples as (tokens (n, seq_len) int32, answer mask (n, seq_len) bool).

    `stream` picks an independent random stream (0 training, 1 held-out).
    """
    N, Q = spec.pairs, num_queries(spec, seq_len)
    rng = np.random.default_rng([spec.seed, stream])
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


def recall_parts(params: str, vocab_size: int, seq_len: int):
    """`build_data`'s parts for a `recall:` spec: (None, train, held-out, counts, description).

    Both token arrays are flat uint32, one example per `seq_len` tokens.
    """
    spec = parse_recall_params(params)
    if spec.vocab_needed > vocab_size:
        raise ValueError(
            f"recall data needs vocab_size >= {spec.vocab_needed} "
            f"(3 reserved + {spec.keys} keys + {spec.values} values), got {vocab_size}"
        )
    train, _ = make_examples(spec, spec.examples, seq_len, stream=0)
    heldout, _ = heldout_examples(spec, seq_len)
    train, heldout = train.reshape(-1).astype(np.uint32), heldout.reshape(-1).astype(np.uint32)
    counts = np.bincount(train, minlength=vocab_size).astype(np.int64)
    what = (
        f"recall ({spec.params()}): {num_queries(spec, seq_len)} queries per {seq_len}-token "
        "example; no tokenizer"
    )
    return None, train, heldout, counts, what
