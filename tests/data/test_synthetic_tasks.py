"""Synthetic task generators: every answer key checked by an independent computation, the
seeding, and that the state-tracking formats keep the state out of the input stream."""

import itertools

import numpy as np
import pytest

from gpn_jax.data import synthetic
from gpn_jax.data.synthetic import memorisation, state

N = 300


def gen(name, seq_len, vocab, split="train", seed=0, n=N, **params):
    ex = synthetic.generate(name, n, seq_len, vocab, seed, split, **params)
    assert ex.inputs.shape == ex.labels.shape == ex.mask.shape
    assert ex.inputs.dtype == np.int32 and ex.mask.dtype == bool
    assert (ex.labels[~ex.mask] == 0).all()  # nothing off the answer positions
    return ex


@pytest.mark.parametrize("noise", [0.0, 0.4])
def test_in_context_recall_answers(noise):
    """By a dictionary walk over the pairs: an answer wherever a real pair's key was seen
    before, with the value it was first paired with; noise pairs use noise ids only."""
    vocab, nv = 32, 16 if noise else 0
    ex = gen("in_context_recall", 64, vocab, frac_noise=noise, noise_vocab=nv)
    half = (vocab - nv) // 2
    for x, y, m in zip(ex.inputs, ex.labels, ex.mask, strict=True):
        seen, answers = {}, np.zeros(64, bool)
        for i in range(0, 64, 2):
            k, v = int(x[i]), int(x[i + 1])
            if k >= vocab - nv:  # a noise pair
                assert v >= vocab - nv
                continue
            assert k < half <= v < vocab - nv
            if k in seen:
                assert seen[k] == v
                answers[i] = True  # the position that predicts the value
                assert y[i] == v
            seen.setdefault(k, v)
        assert (m == answers).all() and m[62]  # the last pair is always a query
    if noise:
        assert 0.25 < (ex.inputs >= vocab - nv).mean() < 0.55


def test_fuzzy_recall_answers():
    """Every answer is the next token and a value id; each example ends on an answered value,
    is left-padded with the pad id, and its probe key appeared earlier with the same value."""
    vocab, T = 16, 64
    for split in ("train", "test"):
        ex = gen("fuzzy_recall", T, vocab, split=split, k_motif=3, v_motif=3)
        for x, y, m in zip(ex.inputs, ex.labels, ex.mask, strict=True):
            assert (y[m] == x[1:][m[:-1]]).all() and not m[-1]
            assert ((y[m] >= (vocab - 1) // 2) & (y[m] < vocab - 1)).all()
            assert m[T - 2]
            body = x[np.argmax(x != vocab - 1) :]
            assert (body != vocab - 1).all()  # padding only on the left
            tail = np.flatnonzero(~m[: T - 1])[-1] + 1  # first answered token of the probe value
            # the probe's value tokens follow its key; the same key+value occurs earlier
            probe = x[tail - 3 + 1 : T] if split == "test" else None
            if probe is not None:  # test keys are always 3 tokens long
                s = "".join(f"{int(t):02d}" for t in probe)
                assert s in "".join(f"{int(t):02d}" for t in x[: T - len(probe)])


def test_selective_copying_answers():
    """The answers are the non-blank tokens before the copy token, in order."""
    ex = gen("selective_copying", 64, 16, n_copy=8)
    for x, y, m in zip(ex.inputs, ex.labels, ex.mask, strict=True):
        copy = int(np.flatnonzero(x == 15)[0])
        assert copy == 64 - 8 - 1
        kept = x[:copy][x[:copy] != 14]
        assert (y[m] == kept).all() and (np.flatnonzero(m) > copy).all()
        assert (x[copy + 1 :] == 14).all()


def test_compression_answers():
    ex = gen("compression", 32, 16)
    assert ex.inputs.shape[1] == 63 and (ex.inputs[:, 31] == 15).all()
    assert (ex.labels[:, 32:] == ex.inputs[:, :31]).all() and ex.mask[:, 32:].all()
    assert not ex.mask[:, :32].any() and (ex.inputs[:, 32:] == 14).all()


def test_memorisation_answers():
    """One key -> value map for every split (a bijection onto values), never in the input."""
    vocab = 64
    table = {}
    for split in ("train", "valid", "test"):
        ex = gen("memorisation", 32, vocab, split=split)
        assert (ex.inputs[:, 1::2] == vocab - 1).all()
        for k, v in zip(ex.inputs[:, 0::2].ravel(), ex.labels[:, 1::2].ravel(), strict=True):
            assert table.setdefault(int(k), int(v)) == v
        assert not np.isin(ex.labels[ex.mask], ex.inputs).any()
    assert len(set(table.values())) == len(table) == (vocab - 1) // 2
    assert len(memorisation.key_value_map(vocab, 0)) == (vocab - 1) // 2


@pytest.mark.parametrize("repeat", [False, True])
def test_mqar_answers(repeat):
    """Each query's label is the value that followed the same key among the pairs; by default
    every key is queried exactly once (Zoology), with `repeat_queries` the sequence fills."""
    pairs, T = 8, 64
    ex = gen("mqar", T, 33, pairs=pairs, repeat_queries=repeat)
    for x, y, m in zip(ex.inputs, ex.labels, ex.mask, strict=True):
        kv = dict(zip(x[0 : 2 * pairs : 2].tolist(), x[1 : 2 * pairs : 2].tolist(), strict=True))
        assert len(kv) == pairs
        queries = np.flatnonzero(m)
        asked = sorted(x[queries].tolist())
        if repeat:
            assert len(queries) == (T - 2 * pairs) // 2
        else:
            assert asked == sorted(kv) and (x[4 * pairs :] == 32).all()  # once each, then pad
        for i in queries:
            assert y[i] == kv[int(x[i])] == x[i + 1]


def test_mqar_once_needs_room_for_every_query():
    with pytest.raises(ValueError, match="seq_len must be >= 4 x pairs = 32"):
        gen("mqar", 24, 33, pairs=8)


@pytest.mark.parametrize(
    "name,vocab,params",
    [("selective_copying", 3, {}), ("noisy_recall", 32, {"noise_vocab": 30}),
     ("in_context_recall", 2, {})],
)  # fmt: skip
def test_a_task_whose_chance_is_one_is_refused(name, vocab, params):
    with pytest.raises(ValueError, match=r"answer symbol\(s\): chance would be 1\.0") as e:
        synthetic.chance(name, vocab, params)
    assert "\n" not in str(e.value)


def _compose_by_hand(perm_ids):
    perms = list(itertools.permutations(range(5)))
    acc = list(range(5))
    out = []
    for p in perm_ids:
        acc = [perms[int(p)][a] for a in acc]  # apply p after what came before
        out.append(perms.index(tuple(acc)))
    return out


def test_state_answers():
    """Parity and sums by a running loop; S5 by composing the permutations one by one."""
    for name, vocab in (("parity", 2), ("modular_addition", 5)):
        ex = gen(name, 24, vocab)
        assert ex.mask.all() and ex.inputs.max() < vocab
        for x, y in zip(ex.inputs, ex.labels, strict=True):
            acc = 0
            for t, xt in enumerate(x):
                acc = (acc + int(xt)) % vocab
                assert y[t] == acc
    ex = gen("s5", 12, 120, n=40)
    for x, y in zip(ex.inputs, ex.labels, strict=True):
        assert y.tolist() == _compose_by_hand(x)


def test_same_seed_same_data_other_seed_or_split_differs():
    for name, T, V, p in (("in_context_recall", 32, 16, {}), ("fuzzy_recall", 32, 16, {}),
                          ("selective_copying", 32, 16, {"n_copy": 4}), ("s5", 16, 120, {}),
                          ("mqar", 32, 33, {"pairs": 4}), ("memorisation", 16, 32, {})):  # fmt: skip
        a, b = gen(name, T, V, **p), gen(name, T, V, **p)
        for u, v in zip(a, b, strict=True):
            assert (u == v).all()
        assert (gen(name, T, V, seed=1, **p).inputs != a.inputs).any()
        assert (gen(name, T, V, split="valid", **p).inputs != a.inputs).any()


def test_state_is_not_in_the_input_stream():
    """The best lookup from the last two inputs predicts a state task's label at chance only;
    a format that writes the running state into the inputs scores ~1 (so the check bites)."""
    for name, vocab in (("parity", 2), ("modular_addition", 5), ("s5", 120)):
        fit, held = gen(name, 32, vocab, n=2000), gen(name, 32, vocab, split="valid", n=500)
        chance = synthetic.chance(name, vocab, {})
        assert state.leak_score(fit, held) < chance + 0.05, name
        # leaky: interleave each input with the state after it (x0 s0 x1 s1 ...)
        leaky = []
        for ex in (fit, held):
            n, T = ex.inputs.shape
            x = np.stack([ex.inputs, ex.labels], 2).reshape(n, 2 * T)
            y = np.zeros_like(x)
            y[:, 0::2] = ex.labels  # the label at each input position, as before
            m = np.zeros_like(x, bool)
            m[:, 0::2] = True
            y[:, 2::2] = ex.labels[:, 1:]
            leaky.append(synthetic.Examples(x, y, m))
        assert state.leak_score(*leaky) > 0.95, name


def test_bad_parameters_are_one_line_errors():
    with pytest.raises(ValueError, match="unknown synthetic task 'nope'"):
        synthetic.generate("nope", 1, 8, 8, 0, "train")
    with pytest.raises(ValueError, match="unknown split"):
        synthetic.generate("parity", 1, 8, 2, 0, "dev")
    with pytest.raises(ValueError, match="vocab 120"):
        synthetic.generate("s5", 1, 8, 100, 0, "train")
    with pytest.raises(ValueError, match="seq_len > 2 n_copy"):
        synthetic.generate("selective_copying", 1, 16, 8, 0, "train", n_copy=8)
