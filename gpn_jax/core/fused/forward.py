"""The fused window's forward: the per-token step over the fused weights, document resets, and
the segmented scan that keeps the residuals (or, with remat, only each segment's start) for
the backward (`fused.backward`)."""

from typing import NamedTuple

import jax

from gpn_jax.core.fused.layout import Dims, with_halves
from gpn_jax.core.fused.products import cols, loop_weights, rows, segments, unsegment
from gpn_jax.core.fused.stages import (
    layer_out,
    layer_pre,
    layer_split,
    rowwise,
    split_cols,
    write,
    write_read,
)
from gpn_jax.core.norms import mm, rms

Array = jax.Array


class Res(NamedTuple):
    """Per-step residuals of the forward (everything but the memory)."""

    s: Array  # (B, D) grounded state entering the step
    zk: Array | None  # (B, [tp,] HK) key pre-activation of s_prev (the write key of this step)
    Z0: Array  # (B, [tp,] N0) fused projection of rms(s)
    c: list  # per layer l >= 1: (B, D) the layer's input
    Z: list  # per layer l >= 1: (B, [tp,] Nl) its fused projection
    p: Array  # (B, D)
    zg: Array  # (B, D) ground gate pre-activation
    zpg: list  # tp > 1, per layer: (B, D) predict-gate pre-activation (its own projection)
    read: list  # tp > 1 with memory, per layer: (r @ Wo (B, D), read norm scale (B, 1))


def step(dm: Dims, fw: dict, carry, xg: Array):
    """One token. carry = (s, zk, M); returns (carry', (p, g), Res)."""
    s, zk, M = carry
    x = rms(s)
    Z0 = cols(x, fw["W0"]) + fw["b0"]
    Mn, g, zk_new, o0 = None, None, None, None
    Zl = Z0
    if dm.memory:
        zk_new, zw, Zl = split_cols(Z0, [dm.hk, dm.hu + 2 * dm.hb, Z0.shape[-1] - dm.write_cols])
        if dm.kernel_passes:  # the write and layer 0's read in one call
            Mn, g, o0 = write_read(dm, zk, zw, fw["a"], split_cols(Zl, dm.layer_cols())[3], M)
        else:
            Mn, g = write(dm, zk, zw, fw["a"], M)
    c, cs, Zs, zpgs, reads = s, [], [], [], []
    for i in range(dm.n_layers):
        if i:
            x = rms(c)
            Zl = cols(x, fw["Wl"][i - 1]) + fw["bl"][i - 1]
            cs.append(c)
            Zs.append(Zl)
        if dm.split:
            zpg = mm(x, fw["Wpg"][i]) + fw["bpg"][i]
            y, read = layer_split(dm, fw, i, Zl, Mn)
            c = jax.nn.sigmoid(zpg) * c + y
            zpgs.append(zpg)
            if read is not None:
                reads.append(read)
        else:
            X2, pg = layer_pre(dm, Zl, Mn) if i or o0 is None else layer_out(dm, Zl, o0)
            c = pg * c + rows(X2, fw["W2o"][i])
    zg = cols(rms(c), fw["Wg"]) + fw["bg"]
    s_new = jax.nn.sigmoid(zg) * c + xg
    return (s_new, zk_new, Mn), (c, g), Res(s, zk, Z0, cs, Zs, c, zg, zpgs, reads)


def reset(dm: Dims, fw: dict, carry, keep_B):
    """The incoming carry, reset to the initial state where `keep_B` is 0 (a document start):
    s = 0, M = 0, and the key pre-activation of s_prev = 0, which is W0's key bias."""
    if keep_B is None:
        return carry
    s, zk, M = carry
    if dm.memory:
        k = rowwise(keep_B, zk)
        zk = zk * k + (1 - k) * fw["b0"][..., : dm.hk]
        M = M * rowwise(keep_B, M)  # 0 / 1: exact in any storage dtype
    return s * keep_B[:, None], zk, M


def scan_steps(dm: Dims, fw, carry, xg_SxBxD, keep: str, keep_SxB=None):
    """Steps over a run of tokens. keep: 'out' -> (p, g); 'res' -> (p, g, Res); 'resM' -> + M
    before each step (before its reset). `keep_SxB`: per-step resets (`reset`) or None."""

    def body(c, x):
        xg, kp = x if keep_SxB is not None else (x, None)
        new, out, res = step(dm, fw, reset(dm, fw, c, kp), xg)
        if keep == "out":
            return new, out
        if keep == "res":
            return new, (out, res)
        return new, (out, res, c[2])

    xs = xg_SxBxD if keep_SxB is None else (xg_SxBxD, keep_SxB)
    return jax.lax.scan(body, carry, xs, unroll=dm.unroll)


def window_primal(dm: Dims, fw, s0, zk0, M0, xg, keep=None):
    fw = loop_weights(dm, with_halves(dm, fw))
    (sT, _, MT), (P, G) = scan_steps(dm, fw, (s0, zk0, M0), xg, "out", keep)
    return sT, MT, P, G


def window_fwd(dm: Dims, fw, s0, zk0, M0, xg, keep=None):
    S = dm.segment
    fwh = loop_weights(dm, with_halves(dm, fw))

    def seg(carry, xs):
        xg_seg, keep_seg = xs
        if dm.remat:
            new, (out) = scan_steps(dm, fwh, carry, xg_seg, "out", keep_seg)
            return new, (carry, out, None)
        new, (out, res) = scan_steps(dm, fwh, carry, xg_seg, "res", keep_seg)
        return new, (carry, out, res)

    xs = (segments(xg, S), segments(keep, S))
    (sT, zkT, MT), (starts, (P, G), res) = jax.lax.scan(seg, (s0, zk0, M0), xs)
    P, G = unsegment(P), None if G is None else unsegment(G)
    return (sT, MT, P, G), (fw, xg, starts, res, MT, keep)
