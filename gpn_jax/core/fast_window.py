"""The GPN / GPN+M window with a hand-scheduled backward pass (`GPNConfig.scan_impl="fused"`).

Same math as `gpn_jax.core.window.scan_window` over `gpn.step` (gradients equal to plain
autodiff within float32 rounding), arranged so the per-token loop only does what is truly
recurrent:

* **Fused projections.** Every projection of a vector through an RMSNorm weight is
  `rms(x) @ (diag(w) W)`, so the norm weights fold into their matrices (outside the loop,
  by ordinary differentiable JAX ops) and projections of the same vector concatenate into
  one matmul: per token one `rms(s) @ W0` serves the write (key, value, beta, decay) and
  predict layer 0 (ffn, gate, query, read gate); one `[h | r] @ [W2; diag(out_norm) Wo]`
  gives ffn + read; one `rms(c) @ Wl` per further layer; one `rms(p) @ diag(g) Wgate`.
* **The write key is computed once.** The key of `s_prev` at step t is the key of `s` at
  step t-1, which is already a column block of W0's output: it rides in the carry.
* **Weight gradients out of the loop.** A `jax.custom_vjp` over the window: the backward
  is a reverse scan that propagates cotangents of (s, key, M) step by step but only
  *emits* each projection's (input activation, output cotangent) pair; after each segment
  of S steps every weight gradient is one `einsum('sbi,sbo->io')` with contraction S*B
  (not T products with contraction B, which is what autodiff of a scan does).
* **Memory.** The (B, H, K, U) memory is never stored per step: the forward keeps it
  every S steps, the backward recomputes it within a segment from the stored write
  inputs (cheap: elementwise plus two (K x U) contractions per head). With
  `remat_segment` > 0 nothing else is stored per step either: each segment's forward is
  rerun in the backward (one extra forward of the loop, memory O(T/S + S) per step-state).

The memory is stored in its carry's dtype (`GPNConfig.memory_dtype`: bfloat16 halves its
per-step traffic), each write computed in float32; the backward keeps the memory's cotangent
in float32 and passes it unchanged through the storage rounding.

Interventions (`gpn.Intervention`) are not supported here: `gpn_jax.models.gpn` refuses
them with an error naming the reference `autodiff` scan (which the ablations use).

Measured (`python -m gpn_jax.bench --config=experiments/configs/bench_small.py`, GPN+M 1L
d=512, B=16, T=512, float32, 2-core AMD EPYC, matmul peak measured in the run 213 GFLOP/s):
training step 4.66 s -> 2.96 s, MFU 30.7 % -> 48.3 %, peak RSS 3.57 -> 1.20 GiB (autodiff ->
fused). `UNROLL` 1, 2 and 4 measured the same on CPU; 1 compiles fastest.
"""

import dataclasses
import math
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gpn_jax.core import gpn, loss
from gpn_jax.core.gpn import GPNCarry, StepOutput
from gpn_jax.core.norms import l2n, mm, rms

Array = jax.Array

UNROLL = 1  # lax.scan unroll of the per-token loops (measured: see gpn_jax/benchmarks)
MIN_SEGMENT = 32  # without remat, memory checkpoints every max(MIN_SEGMENT, sqrt(T)) steps


@dataclasses.dataclass(frozen=True)
class Dims:
    """Static sizes of the fused step (hashable: closes over the custom_vjp)."""

    d: int
    f: int
    h: int
    k: int
    u: int
    n_layers: int
    memory: bool
    segment: int  # steps per segment (memory checkpoint / remat / weight-gradient interval)
    remat: bool  # True: rerun each segment's forward in the backward (store only boundaries)
    unroll: int = UNROLL

    @property
    def hk(self) -> int:
        return self.h * self.k

    @property
    def hu(self) -> int:
        return self.h * self.u

    @property
    def write_cols(self) -> int:
        return self.hk + self.hu + 2 * self.h if self.memory else 0

    def layer_cols(self) -> list[int]:
        """Column widths of a predict layer's fused input projection [w1 | w3 | wpg | wq | wrg]."""
        cols = [self.f, self.f, self.d]
        return cols + ([self.hk, self.hu] if self.memory else [])


# ----------------------------------------------------------------------------- fused weights
def fuse_params(cp: gpn.Params) -> dict:
    """Folds RMSNorm weights into their matrices and concatenates projections of one vector.

    Differentiable: gradients of the fused weights flow back to the original parameters.
    """
    names = gpn.layer_names(cp)
    mem = gpn.has_memory(cp)

    def fold(norm, w):
        return (norm[:, None] * w.astype(jnp.float32)).astype(w.dtype)

    def layer_proj(lp):
        mats = [fold(lp["ffn_norm"], lp[n]) for n in ("w1", "w3")] + [
            fold(lp["pg_norm"], lp["wpg"])
        ]
        biases = [jnp.zeros((2 * lp["w1"].shape[1],), jnp.float32), lp["bpg"]]
        if mem:
            mats += [fold(lp["read_norm"], lp["wq"]), fold(lp["read_norm"], lp["wrg"])]
            biases += [lp["bq"], jnp.zeros((lp["wrg"].shape[1],), jnp.float32)]
        return mats, biases

    mats, biases = [], []
    if mem:
        wp = cp["write"]
        h = wp["A_log"].shape[0]
        mats += [fold(wp["norm"], wp[n]) for n in ("wk", "wv", "wbeta", "wa")]
        biases += [wp["bk"], jnp.zeros((wp["wv"].shape[1] + h,), jnp.float32), wp["dt_bias"]]
    m0, b0 = layer_proj(cp[names[0]])
    fw = {
        "W0": jnp.concatenate(mats + m0, axis=1),
        "b0": jnp.concatenate(biases + b0).astype(jnp.float32),
        "Wl": [],
        "bl": [],
        "W2o": [],
        "Wg": fold(cp["ground"]["gate_norm"], cp["ground"]["gate_w"]),
        "bg": cp["ground"]["gate_b"].astype(jnp.float32),
        "a": jnp.exp(cp["write"]["A_log"]) if mem else jnp.zeros((0,), jnp.float32),
    }
    for i, name in enumerate(names):
        lp = cp[name]
        if i:
            m, b = layer_proj(lp)
            fw["Wl"].append(jnp.concatenate(m, axis=1))
            fw["bl"].append(jnp.concatenate(b).astype(jnp.float32))
        out = [lp["w2"]]
        if mem:
            out.append(fold(lp["out_norm"], lp["wo"]))
        fw["W2o"].append(jnp.concatenate(out, axis=0))
    return fw


def key_projection(cp: gpn.Params, s: Array) -> Array:
    """The write key pre-activation of `s` (bias included): W0's first column block."""
    wp = cp["write"]
    return mm(rms(s) * wp["norm"], wp["wk"]) + wp["bk"]


# ----------------------------------------------------------------------------- elementwise stages
def _heads(x: Array, h: int) -> Array:
    return x.reshape(*x.shape[:-1], h, x.shape[-1] // h)


def _split(x: Array, widths: list[int]) -> list[Array]:
    return jnp.split(x, list(_cumsum(widths[:-1])), axis=-1)


def _cumsum(xs):
    t = 0
    for x in xs:
        t += x
        yield t


def _write(dm: Dims, zk_prev, zw, a, M):
    """Gated delta write from the previous key pre-activation and this step's [v | beta | a] columns.

    Computed in float32, returned in M's dtype (`memory_dtype` storage)."""
    M_in, M = M, M.astype(jnp.float32)
    zv, zb, za = _split(zw, [dm.hu, dm.h, dm.h])
    k = l2n(jax.nn.relu(_heads(zk_prev, dm.h)))
    v = _heads(zv, dm.h)
    beta = jax.nn.sigmoid(zb)
    g = -a * jax.nn.softplus(za)
    k_M = jnp.einsum("bhk,bhku->bhu", k, M)
    delta = jnp.einsum("bhk,bhu->bhku", k, beta[..., None] * (v - k_M))
    return (jnp.exp(g)[..., None, None] * M + delta).astype(M_in.dtype), g


def _layer_pre(dm: Dims, Z, Mn):
    """From a layer's fused projection: X2 = [silu(gate) * up | silu(zrg) * rms(q . M')] and pg."""
    gate, up, zpg, *read = _split(Z, dm.layer_cols())
    h = jax.nn.silu(gate) * up
    pg = jax.nn.sigmoid(zpg)
    if not dm.memory:
        return h, pg
    zq, zrg = read
    q = l2n(jax.nn.relu(_heads(zq, dm.h)))
    o = jnp.einsum("bhk,bhku->bhu", q, Mn.astype(jnp.float32)).reshape(*q.shape[:-2], dm.hu)
    return jnp.concatenate([h, jax.nn.silu(zrg) * rms(o)], axis=-1), pg


def _mm_t(dz: Array, w: Array) -> Array:
    """dz @ w.T in w's dtype, float32 out (the input cotangent of `mm(x, w)`)."""
    return jax.lax.dot_general(
        dz.astype(w.dtype),
        w,
        (((dz.ndim - 1,), (1,)), ((), ())),
        preferred_element_type=jnp.float32,
    )


def _transposed(fw: dict) -> dict:
    """The matrices the backward loop multiplies cotangents by, transposed once outside the loop
    (XLA:CPU runs a (B, N) @ (N, D) product much faster than (B, N) contracted with (D, N))."""
    return {
        "W0": fw["W0"].T,
        "Wl": [w.T for w in fw["Wl"]],
        "W2o": [w.T for w in fw["W2o"]],
        "Wg": fw["Wg"].T,
    }


def _wgrad(x_SxBxI: Array, dz_SxBxO: Array, w: Array) -> Array:
    """sum over (s, b) of x^T dz: one matmul with contraction S*B, float32."""
    return jnp.einsum(
        "sbi,sbo->io",
        x_SxBxI.astype(w.dtype),
        dz_SxBxO.astype(w.dtype),
        preferred_element_type=jnp.float32,
    )


# ----------------------------------------------------------------------------- forward
class Res(NamedTuple):
    """Per-step residuals of the forward (everything but the memory)."""

    s: Array  # (B, D) grounded state entering the step
    zk: Array | None  # (B, HK) key pre-activation of s_prev (the write key of this step)
    Z0: Array  # (B, N0) fused projection of rms(s)
    c: list  # per layer l >= 1: (B, D) the layer's input
    Z: list  # per layer l >= 1: (B, Nl) its fused projection
    p: Array  # (B, D)
    zg: Array  # (B, D) ground gate pre-activation


def _step(dm: Dims, fw: dict, carry, xg: Array):
    """One token. carry = (s, zk, M); returns (carry', (p, g), Res)."""
    s, zk, M = carry
    Z0 = mm(rms(s), fw["W0"]) + fw["b0"]
    Mn, g, zk_new = None, None, None
    Zl = Z0
    if dm.memory:
        zk_new, zw, Zl = _split(Z0, [dm.hk, dm.hu + 2 * dm.h, Z0.shape[-1] - dm.write_cols])
        Mn, g = _write(dm, zk, zw, fw["a"], M)
    c, cs, Zs = s, [], []
    for i in range(dm.n_layers):
        if i:
            Zl = mm(rms(c), fw["Wl"][i - 1]) + fw["bl"][i - 1]
            cs.append(c)
            Zs.append(Zl)
        X2, pg = _layer_pre(dm, Zl, Mn)
        c = pg * c + mm(X2, fw["W2o"][i])
    zg = mm(rms(c), fw["Wg"]) + fw["bg"]
    s_new = jax.nn.sigmoid(zg) * c + xg
    return (s_new, zk_new, Mn), (c, g), Res(s, zk, Z0, cs, Zs, c, zg)


def _reset(dm: Dims, fw: dict, carry, keep_B):
    """The incoming carry, reset to the initial state where `keep_B` is 0 (a document start):
    s = 0, M = 0, and the key pre-activation of s_prev = 0, which is W0's key bias."""
    if keep_B is None:
        return carry
    s, zk, M = carry
    k = keep_B[:, None]
    if dm.memory:
        zk = zk * k + (1 - k) * fw["b0"][: dm.hk]
        M = M * k[..., None, None].astype(M.dtype)  # 0 / 1: exact in any storage dtype
    return s * k, zk, M


def _scan_steps(dm: Dims, fw, carry, xg_SxBxD, keep: str, keep_SxB=None):
    """Steps over a run of tokens. keep: 'out' -> (p, g); 'res' -> (p, g, Res); 'resM' -> + M
    before each step (before its reset). `keep_SxB`: per-step resets (`_reset`) or None."""

    def body(c, x):
        xg, kp = x if keep_SxB is not None else (x, None)
        new, out, res = _step(dm, fw, _reset(dm, fw, c, kp), xg)
        if keep == "out":
            return new, out
        if keep == "res":
            return new, (out, res)
        return new, (out, res, c[2])

    xs = xg_SxBxD if keep_SxB is None else (xg_SxBxD, keep_SxB)
    return jax.lax.scan(body, carry, xs, unroll=dm.unroll)


def _segments(x: Array | None, S: int) -> Array | None:
    return None if x is None else x.reshape(x.shape[0] // S, S, *x.shape[1:])


def _unsegment(x: Array) -> Array:
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _window_primal(dm: Dims, fw, s0, zk0, M0, xg, keep=None):
    (sT, _, MT), (P, G) = _scan_steps(dm, fw, (s0, zk0, M0), xg, "out", keep)
    return sT, MT, P, G


def _window_fwd(dm: Dims, fw, s0, zk0, M0, xg, keep=None):
    S = dm.segment

    def seg(carry, xs):
        xg_seg, keep_seg = xs
        if dm.remat:
            new, (out) = _scan_steps(dm, fw, carry, xg_seg, "out", keep_seg)
            return new, (carry, out, None)
        new, (out, res) = _scan_steps(dm, fw, carry, xg_seg, "res", keep_seg)
        return new, (carry, out, res)

    xs = (_segments(xg, S), _segments(keep, S))
    (sT, zkT, MT), (starts, (P, G), res) = jax.lax.scan(seg, (s0, zk0, M0), xs)
    P, G = _unsegment(P), None if G is None else _unsegment(G)
    return (sT, MT, P, G), (fw, xg, starts, res, MT, keep)


# ----------------------------------------------------------------------------- backward
def _bstep(dm: Dims, fw: dict, fwT: dict, bc, xs):
    """Reverse of one step. bc = (ds, dzk, dM, Mn, da): cotangents of (s', key of s, M') and M'."""
    ds, dzk, dM, Mn, da = bc
    res, Mprev, dp_out, dg_out, keep = xs  # Mprev: before this step's reset (`_reset`)
    # ground: s' = sigmoid(zg) * p + xg
    sg = jax.nn.sigmoid(res.zg)
    dzg = ds * res.p * sg * (1 - sg)
    xp, rms_p = jax.vjp(rms, res.p)
    dc = dp_out + ds * sg + rms_p(mm(dzg, fwT["Wg"]))[0]
    emit = {"Xg": xp, "dZg": dzg, "dxg": ds}
    # predict layers, last to first: c_{i+1} = pg * c_i + X2 @ W2o
    Z_layer0 = res.Z0[..., dm.write_cols :]
    X2s, dYs, Xls, dZls = [], [], [], []
    dZ_layer0 = None
    for i in reversed(range(dm.n_layers)):
        c_in = res.c[i - 1] if i else res.s
        Zl = res.Z[i - 1] if i else Z_layer0
        (X2, pg), pre = jax.vjp(partial(_layer_pre, dm), Zl, _f32(Mn))
        X2s.insert(0, X2)
        dYs.insert(0, dc)
        dZl, dMn = pre((mm(dc, fwT["W2o"][i]), dc * c_in))
        if dm.memory:
            dM = dM + dMn
        dc = dc * pg
        if i:
            xc, rms_c = jax.vjp(rms, c_in)
            dc = dc + rms_c(mm(dZl, fwT["Wl"][i - 1]))[0]
            Xls.insert(0, xc)
            dZls.insert(0, dZl)
        else:
            dZ_layer0 = dZl
    # write: M' = write(key of s_prev, [v | beta | a] of s, M)
    if dm.memory:
        zw = res.Z0[..., dm.hk : dm.write_cols]
        M_in = _f32(Mprev) if keep is None else _f32(Mprev) * keep[:, None, None, None]
        _, wr = jax.vjp(partial(_write, dm), res.zk, zw, fw["a"], M_in)
        dzk_prev, dzw, da_t, dMprev = wr((dM, dg_out))
        dZ0 = jnp.concatenate([dzk, dzw, dZ_layer0], axis=-1)
        da = da + da_t
    else:
        dzk_prev, dMprev, dZ0 = None, None, dZ_layer0
    xs_, rms_s = jax.vjp(rms, res.s)
    ds_prev = dc + rms_s(mm(dZ0, fwT["W0"]))[0]
    emit |= {"X0": xs_, "dZ0": dZ0, "X2": X2s, "dY": dYs, "Xl": Xls, "dZl": dZls}
    if keep is not None:  # through `_reset`: the reset part of the key is W0's key bias
        k = keep[:, None]
        if dm.memory:
            emit["dbk"] = (1 - k) * dzk_prev
            dzk_prev, dMprev = dzk_prev * k, dMprev * k[..., None, None]
        ds_prev = ds_prev * k
    return (ds_prev, dzk_prev, dMprev, Mprev, da), emit


def _f32(M: Array | None) -> Array | None:
    """A stored memory as float32 for the backward's vjps: the memory cotangent stays float32
    and passes the storage rounding unchanged (as autodiff passes a cast)."""
    return None if M is None else M.astype(jnp.float32)


def _recompute_memory(dm: Dims, fw, M0, res: Res, keep_SxB=None):
    """M before each step (and its reset) of a segment, from its starting memory and the
    stored write inputs."""

    def body(M, x):
        r, kp = x
        zw = r.Z0[..., dm.hk : dm.write_cols]
        M_in = M if kp is None else M * kp[:, None, None, None]
        return _write(dm, r.zk, zw, fw["a"], M_in)[0], M

    return jax.lax.scan(body, M0, (res, keep_SxB), unroll=dm.unroll)[1]


def _zeros_like_tree(t):
    return jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), t)


def _window_bwd(dm: Dims, saved, cts):
    fw, xg, starts, res_all, MT, keep = saved
    dsT, dMT, dP, dG = cts
    S = dm.segment
    B = xg.shape[1]
    dP = _segments(dP, S)
    dG = _segments(dG, S) if dm.memory else jnp.zeros((dP.shape[0], S, B, 0), jnp.float32)
    gW = {k: _zeros_like_tree(fw[k]) for k in ("W0", "b0", "Wl", "bl", "W2o", "Wg", "bg")}
    zk_shape = (B, dm.hk)
    fwT = _transposed(fw)

    def seg(carry, xs):
        ds, dzk, dM, Mn, da, gw = carry
        start, res, dp_seg, dg_seg, xg_seg, keep_seg = xs
        if dm.remat:
            _, (_, res, Ms) = _scan_steps(dm, fw, start, xg_seg, "resM", keep_seg)
        elif dm.memory:
            Ms = _recompute_memory(dm, fw, start[2], res, keep_seg)
        else:
            Ms = None
        (ds, dzk, dM, Mn, da), e = jax.lax.scan(
            partial(_bstep, dm, fw, fwT),
            (ds, dzk, dM, Mn, da),
            (res, Ms, dp_seg, dg_seg, keep_seg),
            reverse=True,
            unroll=dm.unroll,
        )
        gw = dict(gw)
        gw["W0"] = gw["W0"] + _wgrad(e["X0"], e["dZ0"], fw["W0"])
        gw["b0"] = gw["b0"] + e["dZ0"].sum((0, 1))
        if "dbk" in e:
            gw["b0"] = gw["b0"].at[: dm.hk].add(e["dbk"].sum((0, 1)))
        gw["Wg"] = gw["Wg"] + _wgrad(e["Xg"], e["dZg"], fw["Wg"])
        gw["bg"] = gw["bg"] + e["dZg"].sum((0, 1))
        gw["W2o"] = [
            g + _wgrad(x, d, w)
            for g, x, d, w in zip(gw["W2o"], e["X2"], e["dY"], fw["W2o"], strict=True)
        ]
        gw["Wl"] = [
            g + _wgrad(x, d, w)
            for g, x, d, w in zip(gw["Wl"], e["Xl"], e["dZl"], fw["Wl"], strict=True)
        ]
        gw["bl"] = [g + d.sum((0, 1)) for g, d in zip(gw["bl"], e["dZl"], strict=True)]
        return (ds, dzk, dM, Mn, da, gw), e["dxg"]

    init = (
        dsT,
        jnp.zeros(zk_shape, jnp.float32) if dm.memory else None,
        dMT,
        MT,
        jnp.zeros_like(fw["a"]),
        gW,
    )
    xs = (starts, res_all, dP, dG, _segments(xg, S), _segments(keep, S))
    (ds0, dzk0, dM0, _, da, gw), dxg = jax.lax.scan(seg, init, xs, reverse=True)
    dfw = {k: jax.tree.map(lambda g, w: g.astype(w.dtype), gw[k], fw[k]) for k in gw}
    dfw["a"] = da
    return dfw, ds0, dzk0, dM0, _unsegment(dxg)


# ----------------------------------------------------------------------------- entry point
def _make_window(dm: Dims):
    @jax.custom_vjp
    def window(fw, s0, zk0, M0, xg, keep=None):
        return _window_primal(dm, fw, s0, zk0, M0, xg, keep)

    def fwd(fw, s0, zk0, M0, xg, keep=None):
        return _window_fwd(dm, fw, s0, zk0, M0, xg, keep)

    def bwd(saved, cts):
        dsT, dMT, dP, dG = cts
        if dm.memory:  # float32 cotangent whatever the memory's storage dtype
            dMT = jnp.zeros(saved[4].shape, jnp.float32) if dMT is None else _f32(dMT)
        keep = saved[5]
        dfw, ds0, dzk0, dM0, dxg = _window_bwd(dm, saved, (dsT, dMT, dP, dG))
        dM0 = None if dM0 is None else dM0.astype(saved[4].dtype)
        return dfw, ds0, dzk0, dM0, dxg, None if keep is None else jnp.zeros_like(keep)

    window.defvjp(fwd, bwd)
    return window


def default_segment(T: int) -> int:
    """Memory checkpoint interval without remat: a divisor of T near max(MIN_SEGMENT, sqrt(T)).

    Its backward recomputes S memories per segment and emits S steps of activations before
    each weight-gradient matmul (contraction S * B), so S is not taken smaller than that.
    """
    target = max(MIN_SEGMENT, math.isqrt(T))
    return max(c for c in range(1, min(T, target) + 1) if T % c == 0)


def dims_of(params: gpn.Params, T: int, remat_segment: int = 0, unroll: int | None = None) -> Dims:
    names = gpn.layer_names(params)
    lp = params[names[0]]
    mem = gpn.memory_shape(params)
    h, k, u = mem if mem else (0, 0, 0)
    if remat_segment and T % remat_segment:
        raise ValueError(
            f"sequence length {T} is not divisible by the remat segment {remat_segment}"
        )
    seg = min(remat_segment, T) if remat_segment else default_segment(T)
    return Dims(
        d=lp["wpg"].shape[0],
        f=lp["w2"].shape[0],
        h=h,
        k=k,
        u=u,
        n_layers=len(names),
        memory=mem is not None,
        segment=seg,
        remat=bool(remat_segment),
        unroll=UNROLL if unroll is None else unroll,
    )


def scan_window_fused(
    cp: gpn.Params,
    carry: GPNCarry,
    xg_TxBxD: Array,
    remat_segment: int = 0,
    unroll: int | None = None,
    keep_TxB: Array | None = None,
) -> tuple[GPNCarry, StepOutput]:
    """Drop-in for `window.scan_window` (no intervention): (final carry, StepOutput (T, B, ...)).
    `keep_TxB` (0 at a document start) resets the incoming carry of those steps."""
    T = xg_TxBxD.shape[0]
    dm = dims_of(cp, T, remat_segment, unroll)
    fw = fuse_params(cp)
    zk0 = key_projection(cp, carry.s_prev) if dm.memory else None
    sT, MT, P, G = _make_window(dm)(fw, carry.s, zk0, carry.M, xg_TxBxD, keep_TxB)
    if not dm.memory:
        return GPNCarry(sT, None, None), StepOutput(P, None)
    # s_prev of the final carry is the state entering the last step: re-ground it from P.
    if T > 1:
        s_last = gpn.ground(cp["ground"], P[T - 2], xg_TxBxD[T - 2])
    else:
        s_last = carry.s
    if keep_TxB is not None:  # the last step's incoming carry was reset there
        s_last = s_last * keep_TxB[T - 1][:, None]
    return GPNCarry(sT, s_last, MT), StepOutput(P, G)


# ----------------------------------------------------------------------------- fused cross-entropy
# The loss is a sum of per-position CEs whose gradient (softmax - onehot) is known in the forward
# pass: computing it there, chunk by chunk, costs 3 decode-sized matmuls per chunk instead of
# the 4 of a rematerialised chunk (forward, recompute, two backward), and the (chunk, B, V)
# logits still never exist twice. The backward only scales the saved gradients.
def _ce_chunk_grads(x, W, bias, E, tgt):
    """CE sum of a chunk and the gradients of that sum w.r.t. (x, W, bias, E)."""
    z = mm(x, W) + bias  # (C, B, Ee)
    logits = mm(z, E.T)  # (C, B, V)
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, tgt[..., None], axis=-1)[..., 0]
    dlog = jnp.exp(logits - lse[..., None]) - jax.nn.one_hot(
        tgt, logits.shape[-1], dtype=logits.dtype
    )
    dz = mm(dlog, E)
    if E.dtype == jnp.float32:
        # (E, V) then transposed: with the (C, B, V) cotangent as the right operand XLA:CPU
        # does not materialise its transpose (a 16-bit dot with a transposed output is not
        # supported there, hence the plain form for other dtypes)
        dE = _wgrad(z, dlog, E.T).T
    else:
        dE = _wgrad(dlog, z, E)
    dW = _wgrad(x, dz, W)
    return jnp.sum(lse - picked), (_mm_t(dz, W), dW, dz.sum((0, 1)), dE)


def _ce_primal(c, W, bias, E, P, tgt):
    def body(total, pt):
        p, t = pt
        logits = mm(mm(rms(p), W) + bias, E.T)
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, t[..., None], axis=-1)[..., 0]
        return total + jnp.sum(lse - picked), None

    return jax.lax.scan(body, jnp.zeros((), jnp.float32), (_segments(P, c), _segments(tgt, c)))[0]


def _ce_fwd(c, W, bias, E, P, tgt):
    def body(acc, pt):
        total, dW, db, dE = acc
        p, t = pt
        x, rms_p = jax.vjp(rms, p)
        ce, (dx, dW_c, db_c, dE_c) = _ce_chunk_grads(x, W, bias, E, t)
        return (total + ce, dW + dW_c, db + db_c, dE + dE_c), rms_p(dx)[0]

    f32 = lambda a: jnp.zeros(a.shape, jnp.float32)
    (total, dW, db, dE), dP = jax.lax.scan(
        body,
        (jnp.zeros((), jnp.float32), f32(W), f32(bias), f32(E)),
        (_segments(P, c), _segments(tgt, c)),
    )
    return total, (dW, db, dE, _unsegment(dP), W, bias, E, tgt)


def _ce_bwd(c, saved, g):
    dW, db, dE, dP, W, bias, E, tgt = saved
    zero_tgt = np.zeros(tgt.shape, dtype=jax.dtypes.float0)
    return (
        (g * dW).astype(W.dtype),
        (g * db).astype(bias.dtype),
        (g * dE).astype(E.dtype),
        g * dP,
        zero_tgt,
    )


_ce_sum = jax.custom_vjp(_ce_primal, nondiff_argnums=(0,))
_ce_sum.defvjp(_ce_fwd, _ce_bwd)


def cross_entropy_sum_fused(cp: gpn.Params, p_TxBxD: Array, targets_TxB: Array, chunk: int = 0):
    """Same value as `loss.cross_entropy_sum` over `gpn.decode`; gradients computed in the
    forward pass."""
    dp = cp["decode"]
    W = (dp["norm"][:, None] * dp["proj"].astype(jnp.float32)).astype(dp["proj"].dtype)
    bias = dp["bias"].astype(jnp.float32) if "bias" in dp else jnp.zeros((W.shape[1],), jnp.float32)
    c = loss.chunk_size(p_TxBxD.shape[0], chunk)
    return _ce_sum(c, W, bias, cp["embed"], p_TxBxD, targets_TxB)
