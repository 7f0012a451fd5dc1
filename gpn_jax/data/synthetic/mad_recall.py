"""MAD's recall tasks (Poli et al. 2024): in-context, noisy and fuzzy recall.

In-context recall (multi-query): a sequence of key-value pairs `k v k v ...`, keys from the
lower half of the vocabulary, values from the upper half; within one example a key always
maps to the same value. Every value whose key appeared earlier in the example is an answer;
the last pair always repeats an earlier key. Noisy recall replaces pairs, with probability
`frac_noise`, by two tokens of a separate noise vocabulary (the top `noise_vocab` ids), which
are never answers. Fuzzy recall makes keys and values motifs of 1..`k_motif` and
1..`v_motif` tokens (keys always `k_motif` long in the valid and test splits, as MAD prompts at
the longest motif), left-padded with a pad token (the top id) to the sequence length; every
value token of a repeated key, and of the final probe, is an answer.
"""

import numpy as np

from gpn_jax.data.synthetic.examples import Examples, check_positive, from_next_token, rng


def _halves(n_symbols: int) -> tuple[int, int]:
    if n_symbols < 2:
        raise ValueError(f"recall needs >= 2 key/value symbols, got {n_symbols}")
    return n_symbols // 2, n_symbols - n_symbols // 2


def in_context_recall(n, seq_len, vocab, seed, split, frac_noise=0.0, noise_vocab=0) -> Examples:
    """`n` examples of (noisy) in-context recall of `seq_len` tokens (even)."""
    check_positive(n=n, seq_len=seq_len, vocab=vocab)
    if seq_len % 2 or seq_len < 4:
        raise ValueError(f"recall seq_len must be even and >= 4, got {seq_len}")
    if not 0 <= frac_noise < 1 or (frac_noise > 0 and noise_vocab < 1):
        raise ValueError("frac_noise must be in [0, 1), with noise_vocab >= 1 when > 0")
    r = rng(seed, split)
    n_keys, n_values = _halves(vocab - noise_vocab)
    pairs = seq_len // 2
    keys = r.integers(0, n_keys, (n, pairs))
    table = n_keys + r.integers(0, n_values, (n, n_keys))  # the example's key -> value map
    noise = r.random((n, pairs)) < frac_noise
    noise[np.arange(n), r.integers(0, pairs - 1, n)] = False  # >= 1 pair before the probe
    noise[:, -1] = False
    # the last pair repeats the key of a random earlier real pair
    score = np.where(noise[:, :-1], -1.0, r.random((n, pairs - 1)))
    keys[:, -1] = keys[np.arange(n), score.argmax(1)]
    values = np.take_along_axis(table, keys, axis=1)
    tokens = np.empty((n, seq_len), np.int64)
    tokens[:, 0::2], tokens[:, 1::2] = keys, values
    noise_ids = vocab - noise_vocab + r.integers(0, max(noise_vocab, 1), (n, pairs, 2))
    tokens = np.where(np.repeat(noise, 2, axis=1), noise_ids.reshape(n, seq_len), tokens)
    onehot = (keys[..., None] == np.arange(n_keys)) & ~noise[..., None]
    seen_before = np.take_along_axis(np.cumsum(onehot, 1) - onehot, keys[..., None], 2)[..., 0]
    answers = np.zeros((n, seq_len), bool)
    answers[:, 1::2] = (seen_before > 0) & ~noise
    return from_next_token(tokens, answers)


def noisy_recall(n, seq_len, vocab, seed, split, frac_noise=0.2, noise_vocab=16) -> Examples:
    """In-context recall with noise pairs (MAD's noisy recall)."""
    return in_context_recall(n, seq_len, vocab, seed, split, frac_noise, noise_vocab)


def _motif(r, lo: int, size: int, count: int) -> tuple:
    return tuple(int(x) for x in lo + r.choice(count, size, replace=False))


def _fuzzy_one(r, seq_len, vocab, k_motif, v_motif, long_keys):
    n_keys, n_values = _halves(vocab - 1)
    k_size = lambda: k_motif if long_keys else int(r.integers(1, k_motif + 1))
    v_size = lambda: int(r.integers(1, v_motif + 1))
    mapping, seq, ans = {}, [], []
    budget = seq_len - (k_motif + v_motif)  # room left for the final probe
    while len(seq) + k_motif + v_motif <= budget or not mapping:
        k = _motif(r, 0, k_size(), n_keys)
        repeat = k in mapping
        v = mapping.setdefault(k, _motif(r, n_keys, v_size(), n_values))
        seq += [*k, *v]
        ans += [False] * len(k) + [repeat] * len(v)
    probe = list(mapping)[int(r.integers(len(mapping)))]
    seq += [*probe, *mapping[probe]]
    ans += [False] * len(probe) + [True] * len(mapping[probe])
    pad = seq_len - len(seq)
    return [vocab - 1] * pad + seq, [False] * pad + ans


def fuzzy_recall(n, seq_len, vocab, seed, split, k_motif=3, v_motif=3) -> Examples:
    """`n` examples of MAD's fuzzy (multi-token key and value) in-context recall."""
    check_positive(n=n, seq_len=seq_len, vocab=vocab, k_motif=k_motif, v_motif=v_motif)
    if seq_len < 2 * (k_motif + v_motif) or (vocab - 1) // 2 < max(k_motif, v_motif):
        raise ValueError(
            f"fuzzy recall needs seq_len >= {2 * (k_motif + v_motif)} and vocab >= "
            f"{2 * max(k_motif, v_motif) + 1}, got {seq_len} and {vocab}"
        )
    r = rng(seed, split)
    rows = [_fuzzy_one(r, seq_len, vocab, k_motif, v_motif, split != "train") for _ in range(n)]
    tokens = np.array([t for t, _ in rows])
    return from_next_token(tokens, np.array([a for _, a in rows]))
