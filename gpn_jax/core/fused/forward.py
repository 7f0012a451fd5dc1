"""The fused window's forward: the per-token step over the fused weights, document resets, and
the segmented scan that keeps the residuals (or, with remat, only each segment's start) for
the backward (`fused.backward`)."""

from typing import NamedTuple

import jax

from gpn_jax.core.fused.layout import Dims, with_halves
from gpn_jax.core.fused.products import cols, loop_weights, rows, segments, unsegment
from gpn_jax.core.fused.stages import (
    layer_out,
    layer_split,
    read_out,
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
    """One token. carry = (s, zk, M); returns (carry', (p, g, each layer's memory read o), Res)."""
    s, zk, M = carry
    x = rms(s)
    Z0 = cols(x, fw["W0"]) + fw["b0"]
    Mn, g, zk_new, o0 = None, None, None, None
    if dm.memory:
        zk_new, zw, Zl = split_cols(Z0, [dm.hk, dm.hu + 2 * dm.hb, Z0.shape[-1] - dm.write_cols])
        if dm.kernel_passes:  # the write and layer 0's read in one call
            Mn, g, o0 = write_read(dm, zk, zw, fw["a"], split_cols(Zl, dm.layer_cols())[3], M)
        else:
            Mn, g = write(dm, zk, zw, fw["a"], M)

    def read(i, Zl):  # layer i's read of the written memory
        if i == 0 and o0 is not None:
            return o0
        return read_out(dm, split_cols(Zl, dm.layer_cols())[3], Mn)

    c, cs, Zs, zpgs, reads, os = layers(dm, fw, s, x, Z0, read if dm.memory else None, Mn)
    zg = cols(rms(c), fw["Wg"]) + fw["bg"]
    s_new = jax.nn.sigmoid(zg) * c + xg
    return (s_new, zk_new, Mn), (c, g, os), Res(s, zk, Z0, cs, Zs, c, zg, zpgs, reads)


def layers(dm: Dims, fw: dict, s, x, Z0, read, Mn):
    """The predict layers from the step's state s, x = rms(s) and W0's output Z0:
    (p, each further layer's input and projection, tp > 1: each layer's predict-gate
    pre-activation and (r @ Wo, scale), tp == 1: each layer's memory read o). `read(i, Zl)` is
    layer i's read (None without memory); with tp > 1 the layers read the written memory Mn.
    Row-wise throughout: any leading axes, one step's (B,) or a segment's (S, B)."""
    c, Zl = s, Z0[..., dm.write_cols :]
    cs, Zs, zpgs, reads, os = [], [], [], [], []
    for i in range(dm.n_layers):
        if i:
            x = rms(c)
            Zl = cols(x, fw["Wl"][i - 1]) + fw["bl"][i - 1]
            cs.append(c)
            Zs.append(Zl)
        if dm.split:
            zpg = mm(x, fw["Wpg"][i]) + fw["bpg"][i]
            y, split_read = layer_split(dm, fw, i, Zl, Mn)
            c = jax.nn.sigmoid(zpg) * c + y
            zpgs.append(zpg)
            if split_read is not None:
                reads.append(split_read)
        else:
            o = None if read is None else read(i, Zl)
            X2, pg = layer_out(dm, Zl, o)
            c = pg * c + rows(X2, fw["W2o"][i])
            if o is not None:
                os.append(o)
    return c, cs, Zs, zpgs, reads, os


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
    """Steps over a run of tokens. keep: 'out' -> (p, g); 'reads' -> (p, g, the memory read of
    each layer but the last, whose output is p); 'res' -> ((p, g), Res); 'resM' -> + M before
    each step (before its reset).
    `keep_SxB`: per-step resets (`reset`) or None."""

    def body(c, x):
        xg, kp = x if keep_SxB is not None else (x, None)
        new, (p, g, os), res = step(dm, fw, reset(dm, fw, c, kp), xg)
        if keep == "out":
            return new, (p, g)
        if keep == "reads":
            return new, (p, g, os[:-1])
        if keep == "res":
            return new, ((p, g), res)
        return new, ((p, g), res, c[2])

    xs = xg_SxBxD if keep_SxB is None else (xg_SxBxD, keep_SxB)
    return jax.lax.scan(body, carry, xs, unroll=dm.unroll)


def window_primal(dm: Dims, fw, s0, zk0, M0, xg, keep=None):
    fw = loop_weights(dm, with_halves(dm, fw))
    (sT, _, MT), (P, G) = scan_steps(dm, fw, (s0, zk0, M0), xg, "out", keep)
    return sT, MT, P, G


def window_fwd(dm: Dims, fw, s0, zk0, M0, xg, keep=None):
    """The window and what its backward needs: per segment the carry entering it and, without
    remat, every step's residuals; with `remat_parallel`, every step's memory reads but the last
    layer's (the predicted states it keeps as well are the window's output)."""
    S = dm.segment
    fwh = loop_weights(dm, with_halves(dm, fw))

    def seg(carry, xs):
        xg_seg, keep_seg = xs
        if dm.remat and dm.remat_parallel:
            new, (p, g, reads) = scan_steps(dm, fwh, carry, xg_seg, "reads", keep_seg)
            return new, (carry, (p, g), reads)
        if dm.remat:
            new, (out) = scan_steps(dm, fwh, carry, xg_seg, "out", keep_seg)
            return new, (carry, out, None)
        new, (out, res) = scan_steps(dm, fwh, carry, xg_seg, "res", keep_seg)
        return new, (carry, out, res)

    xs = (segments(xg, S), segments(keep, S))
    (sT, zkT, MT), (starts, (P, G), res) = jax.lax.scan(seg, (s0, zk0, M0), xs)
    if dm.remat and dm.remat_parallel:
        res = (P, res)  # per segment: (p (S, B, D), reads)
    P, G = unsegment(P), None if G is None else unsegment(G)
    return (sT, MT, P, G), (fw, xg, starts, res, MT, keep)
