"""Streaming long-context evaluation: PPL by position over a long token stream.

The stream is fed in consecutive windows of `window` tokens with the recurrent state carried
across them, so the token at stream position n is predicted from all n tokens before it.
This is what a recurrent model (GPN, GPN+M, Gated DeltaNet) can do and a fixed-window
Transformer cannot: a model whose `init_state` is None carries nothing, so each window
restarts and its numbers are the fixed-window ones for the same tokens. Recurrent models
also report that restarted ("reset") number, the baseline the carry is measured against.

With `eos_id` (documents mode, `--stream_documents`) the state is reset at every document
start, as stateful training does (`models.base.document_starts`), and the buckets are of the
position *within its document* (the stream's first token counts as a document start), so a
bucket beyond the window holds tokens that only a state carried across windows can use.
"""

import functools
import math
import re

import jax
import numpy as np

from gpn_jax.models.base import document_starts, reset_after_eos

DEFAULT_BUCKETS = "0,2k,8k,32k"
_SIZE = re.compile(r"^(\d+)([kKmM]?)$")


def parse_buckets(text: str | list[int]) -> list[int]:
    """'0,2k,8k,32k' -> [0, 2048, 8192, 32768] (k = 1024, m = 1024^2): bucket edges."""
    if not isinstance(text, str):
        edges = [int(e) for e in text]
    else:
        edges = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            m = _SIZE.match(part)
            if not m:
                raise ValueError(f"bad stream bucket edge {part!r}; expected e.g. '0,2k,8k,32k'")
            edges.append(int(m.group(1)) * {"": 1, "k": 1024, "m": 1024**2}[m.group(2).lower()])
    if not edges or edges[0] != 0:
        edges = [0] + edges
    if len(edges) < 2 or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
        raise ValueError(f"stream bucket edges must increase from 0, got {edges}")
    return edges


def _fmt(n: int) -> str:
    if n and n % 1024**2 == 0:
        return f"{n // 1024**2}m"
    return f"{n // 1024}k" if n and n % 1024 == 0 else str(n)


def carries_state(model) -> bool:
    """Whether the model carries a state across windows (Transformer++: no)."""
    return model.init_state(1) is not None


def stream_token_losses(
    model, params, streams_SxN: np.ndarray, window: int, carry: bool = True, eos_id=None
):
    """CE (S, N) float64 of every stream position, fed `window` tokens at a time.

    carry=True passes the state from window to window (starting fresh); carry=False restarts
    every window. N must be a multiple of `window`. `eos_id`: reset the state of a carrying
    model at every document start (inside and between windows).
    """
    S, N = streams_SxN.shape
    if N % window:
        raise ValueError(f"stream length {N} is not a multiple of the window {window}")
    step = jitted_token_losses(model)
    state = model.init_state(S) if carry else None
    out = []
    resetting = eos_id is not None and carries_state(model)
    for lo in range(0, N, window):
        x = np.asarray(streams_SxN[:, lo : lo + window], np.int32)
        kw = {"resets": document_starts(x, eos_id)} if resetting else {}
        ce, new_state = step(params, x, state, **kw)
        if carry:
            state = reset_after_eos(model, new_state, x, eos_id) if resetting else new_state
        out.append(np.asarray(ce, np.float64))
    return np.concatenate(out, axis=1)


@functools.lru_cache(maxsize=8)
def jitted_token_losses(model):
    """`jax.jit(model.token_losses)`, built once per model: the evals' one token-loss jit
    (streaming here, continuation scoring in `scoring`)."""
    return jax.jit(model.token_losses)


def document_positions(streams_SxN: np.ndarray, eos_id: int) -> np.ndarray:
    """(S, N) position of each token within its document (0 at a stream's start and after
    every `eos_id`)."""
    S, N = streams_SxN.shape
    n = np.broadcast_to(np.arange(N), (S, N))
    starts = np.zeros((S, N), bool)
    starts[:, 0] = True
    starts[:, 1:] = streams_SxN[:, :-1] == eos_id
    last_start = np.maximum.accumulate(np.where(starts, n, 0), axis=1)
    return n - last_start


def bucket_stats(ce_SxN: np.ndarray, edges: list[int], positions_SxN=None) -> dict:
    """{'<lo>-<hi>': {'loss', 'ppl', 'tokens'}} over positions [lo, hi) that exist: stream
    positions, or `positions_SxN` (e.g. within the document) if given."""
    if positions_SxN is None:
        positions_SxN = np.broadcast_to(np.arange(ce_SxN.shape[1]), ce_SxN.shape)
    N = int(positions_SxN.max()) + 1
    out = {}
    for lo, hi in zip(edges, edges[1:], strict=False):
        if lo >= N:
            break
        part = ce_SxN[(positions_SxN >= lo) & (positions_SxN < hi)]
        if not part.size:
            continue
        loss = float(part.mean())
        out[f"{_fmt(lo)}-{_fmt(min(hi, N))}"] = {
            "loss": loss,
            "ppl": math.exp(loss),
            "tokens": int(part.size),
        }
    return out


def stream_eval(
    model,
    params,
    tokens,
    window: int,
    buckets: str | list[int] = DEFAULT_BUCKETS,
    num_streams: int = 1,
    eos_id: int | None = None,
) -> dict:
    """Streaming PPL by position bucket.

    Args:
      tokens: a flat token array; cut into `num_streams` consecutive streams (rows) of equal
        length N = min(last edge, len // num_streams), rounded down to whole windows.
      window: tokens fed per call (the training window is the natural choice).
      buckets: position bucket edges ('0,2k,8k,32k' or a list).
      eos_id: documents mode (see the module doc): resets at document starts, buckets of the
        position within the document.

    Returns:
      {'mode': 'carried' | 'fixed_window', 'window', 'streams', 'stream_tokens', 'buckets',
       'overall', ['reset': {'buckets', 'overall'}]}.
    """
    edges = parse_buckets(buckets)
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    tokens = np.asarray(tokens)
    per_stream = min(edges[-1], len(tokens) // max(num_streams, 1))
    N = per_stream // window * window
    if num_streams < 1 or N < window:
        raise ValueError(
            f"stream too short: {len(tokens)} tokens cannot give {num_streams} stream(s) of at "
            f"least one {window}-token window"
        )
    streams = tokens[: num_streams * N].reshape(num_streams, N).astype(np.int32)
    carried = carries_state(model)
    ce = stream_token_losses(model, params, streams, window, carry=carried, eos_id=eos_id)
    pos = None if eos_id is None else document_positions(streams, eos_id)
    result = {
        "mode": "carried" if carried else "fixed_window",
        "window": window,
        "streams": num_streams,
        "stream_tokens": N,
        "positions": "stream" if eos_id is None else "within document (reset at each start)",
        "buckets": bucket_stats(ce, edges, pos),
        "overall": _overall(ce),
    }
    if carried:  # every window restarted too
        reset = stream_token_losses(model, params, streams, window, carry=False, eos_id=eos_id)
        result["reset"] = {"buckets": bucket_stats(reset, edges, pos), "overall": _overall(reset)}
    return result


def _overall(ce: np.ndarray) -> dict:
    loss = float(ce.mean())
    return {"loss": loss, "ppl": math.exp(loss), "tokens": int(ce.size)}
