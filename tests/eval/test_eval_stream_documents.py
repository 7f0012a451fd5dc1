"""`--stream_documents`: the streaming eval with the state reset at every document start (as
stateful training) and buckets of the position within the document."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpn_jax.eval import stream
from tests.helpers.eval_models import GDN, GPN_M, TF, build, ce_bound
from tests.tolerance import assert_rel_close

EOS = 2


def test_document_positions():
    s = np.array([[5, EOS, 6, 7, EOS, EOS, 8]])
    np.testing.assert_array_equal(stream.document_positions(s, EOS), [[0, 1, 0, 1, 2, 0, 0]])


@pytest.mark.parametrize("cfg", [GPN_M, GDN], ids=["gpn_m", "gdn"])
def test_carried_documents_equal_each_document_scored_alone(cfg):
    """Documents crossing window edges (window 4, separators at 5, 11 and 15, the last one a
    window's last position): every token's CE is that of its document scored alone."""
    model, params = build(cfg)
    rng = np.random.default_rng(0)
    docs = [rng.integers(3, 64, n) for n in (5, 5, 3, 8)]
    docs = [np.append(d, EOS) for d in docs[:-1]] + [docs[-1]]  # lengths 6, 6, 4, 8: 6 windows
    flat = np.concatenate(docs).astype(np.int32)
    ce = stream.stream_token_losses(model, params, flat[None], 4, carry=True, eos_id=EOS)
    # each document alone, one row each, right-padded to the longest (causal: what follows a
    # document changes none of its CEs) so that the reference compiles once
    rows = np.zeros((len(docs), max(map(len, docs))), np.int32)
    for row, d in zip(rows, docs, strict=True):
        row[: len(d)] = d
    alone, _ = jax.jit(model.token_losses)(params, jnp.asarray(rows))
    alone = np.concatenate([np.asarray(alone)[i, : len(d)] for i, d in enumerate(docs)])
    # another program for the same documents, each at most 8 positions long
    assert_rel_close(ce, alone[None], ce_bound(8), "per-token CE")
    result = stream.stream_eval(model, params, flat, 4, [0, 4, 8, 24], eos_id=EOS)
    assert result["positions"] == "within document (reset at each start)"
    assert {k: b["tokens"] for k, b in result["buckets"].items()} == {"0-4": 16, "4-8": 8}


def test_transformer_in_documents_mode_restarts_every_window():
    model, params = build(TF)
    flat = np.arange(3, 35, dtype=np.int32) % 60 + 3
    result = stream.stream_eval(model, params, flat, 8, [0, 16, 32], eos_id=EOS)
    assert result["mode"] == "fixed_window" and "reset" not in result
