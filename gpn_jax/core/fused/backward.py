"""The fused window's backward: a reverse scan per segment that propagates the cotangents of
(s, key, M) step by step but only emits each projection's (input, output cotangent) pair; after
each segment every weight gradient is one product with contraction S*B.

The memory is recomputed per segment from its checkpoint and the stored write inputs
(`recompute_memory`, or the kernels' `stack`); with remat the segment's forward reruns. The
memory's cotangent stays float32 and passes the storage rounding unchanged.
"""

from functools import partial

import jax
import jax.numpy as jnp

from gpn_jax.core.fused.forward import Res, layers, scan_steps
from gpn_jax.core.fused.layout import BLOCK_DIM, Dims, along, transposed, with_halves
from gpn_jax.core.fused.products import (
    bias_grad,
    cols,
    loop_weights,
    padded_to,
    rows,
    segments,
    unsegment,
    wgrad,
)
from gpn_jax.core.fused.stages import (
    as_f32,
    layer_local,
    layer_out,
    layer_pre,
    read_query,
    rowwise,
    split_cols,
    write,
    write_gates,
    write_inputs,
    write_key,
)
from gpn_jax.core.gpn import delta_factored
from gpn_jax.core.norms import mm, rms

Array = jax.Array


def layer_split_bwd(dm: Dims, fwT: dict, i: int, res: Res, Z, Mn, dc):
    """tp > 1. Reverse of `layer_split` (+ the predict gate) from its output cotangent dc
    (B, D): (dZ, dM', X2 = [h | scale * r] for W2o's gradient, pg). With the read scale after
    Wo its derivative needs only dc and the saved (r @ Wo, scale), all replicated, and local
    products: no reduction here (the layer's one all-reduce is its input cotangent)."""
    pg = jax.nn.sigmoid(res.zpg[i])
    dX2 = cols(dc, fwT["W2o"][i])  # (B, tp, fb + hu): [dh | d(r @ Wo)]
    (h, r, o), pre = jax.vjp(partial(layer_local, dm), Z, as_f32(Mn))
    if not dm.memory:
        dZ, _ = pre((dX2, None, None))
        return dZ, None, h, pg
    y_r, scale = res.read[i]
    dh, dr = split_cols(dX2, [dm.fb, dm.hu])
    # y = ... + scale * y_r, scale = (sum(o^2) / HU + eps)^(-1/2):
    # d scale = sum_d dc * y_r, d sum(o^2) = -scale^3 / (2 HU) d scale, d o = 2 o d sum(o^2)
    dss = -0.5 * jnp.sum(dc * y_r, axis=-1, keepdims=True) * scale**3 / (dm.h * dm.u)
    sb = scale[..., None]  # (B, 1, 1) against the blocks
    dZ, dMn = pre((dh, sb * dr, 2 * o * dss[..., None]))
    return dZ, dMn, jnp.concatenate([h, sb * r], axis=-1), pg


def memory_bwd(dm: Dims, fw: dict, stack, step, res: Res, Z, dM, keep, dX2, dpg, dg_out):
    """One predict layer's backward (tp == 1) with the write and the read, the memory's part in
    one pass, the kernels' `grad`: (dZ, X2, pg, (dzk_prev, dzw, da, dM_prev)).

    With Mi = keep stack[t], the memory entering step t after its reset, and kM = Mi^T k,
    qM = Mi^T q from the recomputation (`memory_stack`), the step's write M' = eg Mi + k w^T and
    read o = M'^T q are `core.gpn.delta_factored`'s (w, o) of (kM, qM), so only (B, H, .) vectors
    are left to JAX's vjp. The read's cotangent is known before the memory's pass (it needs only
    the layer's output cotangent), hence its parts dkM_read and dqM of kM and qM; `grad` then
    forms every memory-sized product in one pass: dM^T k (w's cotangent from M'), <dM, Mi> (eg's),
    dM w, Mi dkM and Mi dqM (k's and q's) and dM_prev = keep (eg dM + k dkM^T + q dqM^T).
    The read's own memory cotangent q dO^T is never formed: it reaches M through qM."""
    t, kM, qM = step
    zw = res.Z0[..., dm.hk : dm.write_cols]
    keep_B = jnp.ones(dM.shape[:1], jnp.float32) if keep is None else keep

    def keys(zk, Z):
        return write_key(dm, zk), read_query(dm, split_cols(Z, dm.layer_cols())[3])

    def gates(zw, a):
        v, beta, g = write_gates(dm, zw, a)
        return v, beta, jnp.exp(g), g

    (k, q), keys_vjp = jax.vjp(keys, res.zk, Z)
    (v, beta, eg, _), gates_vjp = jax.vjp(gates, zw, _per_row(fw["a"], zw))
    (w, o), fac_vjp = jax.vjp(delta_factored, k, q, v, beta, eg, kM, qM)
    (X2, pg), out_vjp = jax.vjp(partial(layer_out, dm), Z, o.reshape(*o.shape[:-2], dm.hu))
    dZ, do = out_vjp((dX2, dpg))
    dk, dq, dv, dbeta, deg, dkM, dqM = fac_vjp((jnp.zeros_like(w), do.reshape(o.shape)))
    dM_prev, dMk, dMw, inner, Mi_dkM, Mi_dqM = dm.kernels.grad(
        stack, t, keep_B, dM, k, q, w, beta, eg, dkM, dqM
    )
    _, _, dv_w, dbeta_w, *_ = fac_vjp((dMk, jnp.zeros_like(o)))  # w's cotangent from M'
    dzw, da = gates_vjp((dv + dv_w, dbeta + dbeta_w, deg + inner, dg_out))
    dzk_prev, dZ_q = keys_vjp((dk + dMw + Mi_dkM, dq + Mi_dqM))
    return dZ + dZ_q, X2, pg, (dzk_prev, dzw, da, dM_prev)


AT_ONCE = ("X0", "Xg", "dZg", "Xl")  # emitted pairs a rerun at once forms outside the loop


def bstep(dm: Dims, fw: dict, fwT: dict, stack, bc, xs):
    """Reverse of one step. bc = (ds, dzk, dM, Mn, da): cotangents of (s', key of s, M'), M'
    and the decay rate's cotangent so far, per row (`_per_row`).
    `stack`: the segment's recomputed memories when the memory's passes are the kernels'
    (`memory_bwd`; xs then holds (t, kM, qM) where it otherwise holds M before the step, and
    the carry's Mn is None)."""
    ds, dzk, dM, Mn, da = bc
    res, Mprev, dp_out, dg_out, keep = xs  # Mprev: before this step's reset (`reset`)
    dc, emit = _ground_bwd(fwT, res, ds, dp_out)
    dc, dM, dZ_layer0, mem_grads, layers = _layers_bwd(
        dm, fw, fwT, stack, res, (Mprev, Mn), dM, keep, dc, dg_out
    )
    emit |= layers
    # write: M' = write(key of s_prev, [v | beta | a] of s, M)
    write_grads = _write_bwd(dm, fw, res, Mprev, keep, dM, dg_out, mem_grads)
    if write_grads is None:
        dzk_prev, dMprev, dZ0 = None, None, dZ_layer0
    else:
        dzk_prev, dzw, da_t, dMprev = write_grads
        dZ0 = jnp.concatenate([dzk, dzw, dZ_layer0], axis=-1)
        da = da + da_t
    xs_, rms_s = jax.vjp(rms, res.s)
    dx = rows(padded_to(dZ0, fwT["W0"]), fwT["W0"])
    if dm.split:
        dx = dx + mm(emit["dZpg"][0], fwT["Wpg"][0])
    ds_prev = dc + rms_s(dx)[0]
    emit |= {"X0": xs_, "dZ0": dZ0}
    if keep is not None:
        ds_prev, dzk_prev, dMprev = _reset_bwd(
            dm, keep, ds_prev, dzk_prev, dMprev, mem_grads is None, emit
        )
    if dm.remat and dm.remat_parallel:  # formed over the segment at once (`inputs_at_once`)
        emit = {k: v for k, v in emit.items() if k not in AT_ONCE}
    return (ds_prev, dzk_prev, dMprev, Mprev if stack is None else Mn, da), emit


def _ground_bwd(fwT: dict, res: Res, ds, dp_out):
    """Reverse of s' = sigmoid(zg) * p + xg: (dc, the ground gate's emitted pairs)."""
    sg = jax.nn.sigmoid(res.zg)
    dzg = ds * res.p * sg * (1 - sg)
    xp, rms_p = jax.vjp(rms, res.p)
    dc = dp_out + ds * sg + rms_p(cols(dzg, fwT["Wg"]))[0]
    return dc, {"Xg": xp, "dZg": dzg, "dxg": ds}


def _layers_bwd(dm: Dims, fw, fwT, stack, res: Res, memories, dM, keep, dc, dg_out):
    """The predict layers, last to first (c_{i+1} = pg * c_i + X2 @ W2o): (dc into the step's
    state, dM, layer 0's dZ, the kernels' write gradients (`memory_bwd`) or None, the emitted
    pairs per layer)."""
    Mprev, Mn = memories
    out = {"X2": [], "dY": [], "Xl": [], "dZl": [], "dZpg": []}
    dZ_layer0, mem_grads = None, None
    for i in reversed(range(dm.n_layers)):
        c_in = res.c[i - 1] if i else res.s
        Zl = res.Z[i - 1] if i else res.Z0[..., dm.write_cols :]
        if dm.split:
            dZl, dMn, X2, pg = layer_split_bwd(dm, fwT, i, res, Zl, Mn, dc)
            out["dZpg"].insert(0, dc * c_in * pg * (1 - pg))
        elif stack is not None:
            dX2 = cols(dc, fwT["W2o"][i])
            dZl, X2, pg, mem_grads = memory_bwd(
                dm, fw, stack, Mprev, res, Zl, dM, keep, dX2, dc * c_in, dg_out
            )
        else:
            (X2, pg), pre = jax.vjp(partial(layer_pre, dm), Zl, as_f32(Mn))
            dZl, dMn = pre((cols(dc, fwT["W2o"][i]), dc * c_in))
        out["X2"].insert(0, X2)
        out["dY"].insert(0, dc)
        if dm.memory and stack is None:
            dM = dM + dMn
        dc = dc * pg
        if not i:
            dZ_layer0 = dZl
            continue
        xc, rms_c = jax.vjp(rms, c_in)
        dx = rows(padded_to(dZl, fwT["Wl"][i - 1]), fwT["Wl"][i - 1])
        if dm.split:
            dx = dx + mm(out["dZpg"][0], fwT["Wpg"][i])
        dc = dc + rms_c(dx)[0]
        out["Xl"].insert(0, xc)
        out["dZl"].insert(0, dZl)
    return dc, dM, dZ_layer0, mem_grads, out


def _write_bwd(dm: Dims, fw, res: Res, Mprev, keep, dM, dg_out, mem_grads):
    """Reverse of the write: (dzk_prev, dzw, da, dM entering the step), None without memory.
    `mem_grads`: the kernels' (`memory_bwd`, already through the reset)."""
    if mem_grads is not None:
        return mem_grads
    if not dm.memory:
        return None
    zw = res.Z0[..., dm.hk : dm.write_cols]
    M_in = as_f32(Mprev) if keep is None else as_f32(Mprev) * rowwise(keep, Mprev)
    _, wr = jax.vjp(partial(write, dm), res.zk, zw, _per_row(fw["a"], zw), M_in)
    return wr((dM, dg_out))


def _per_row(a, zw):
    """The decay rate `a` ([tp,] hb) broadcast to each row of the step's write columns `zw`
    (B, [tp,] cols): its cotangent then stays per row in the backward's carry, summed over the
    rows once after the scan instead of at every step."""
    return jnp.broadcast_to(a, (zw.shape[0], *a.shape))


def _reset_bwd(dm: Dims, keep, ds_prev, dzk_prev, dMprev, through_memory: bool, emit: dict):
    """Through `reset`: rows starting a document pass no cotangent to the previous carry; the
    reset part of the key is W0's key bias (emitted as `dbk`)."""
    if dm.memory:
        k = rowwise(keep, dzk_prev)
        emit["dbk"] = (1 - k) * dzk_prev
        dzk_prev = dzk_prev * k
        if through_memory:
            dMprev = dMprev * rowwise(keep, dMprev)
    return ds_prev * keep[:, None], dzk_prev, dMprev


def memory_stack(dm: Dims, fw, M0, res: Res, keep_SxB=None):
    """By the kernels' `stack`: (Ms, kM, qM), the memory before each step (and
    its reset) of a segment, and Mi^T k, Mi^T q of each step (layer 0's query)."""
    zw = res.Z0[..., dm.hk : dm.write_cols]
    k, v, beta, g = write_inputs(dm, res.zk, zw, fw["a"])
    q = read_query(dm, split_cols(res.Z0[..., dm.write_cols :], dm.layer_cols())[3])
    keep = jnp.ones(res.zk.shape[:2], jnp.float32) if keep_SxB is None else keep_SxB
    return dm.kernels.stack(M0, k, q, v, beta, jnp.exp(g), keep)


def recompute_memory(dm: Dims, fw, M0, res: Res, keep_SxB=None):
    """M before each step (and its reset) of a segment, from its starting memory and the
    stored write inputs; by the kernels' `stack` where the window has them (`memory_stack`)."""
    if dm.kernel_passes:
        return memory_stack(dm, fw, M0, res, keep_SxB)[0]

    def body(M, x):
        r, kp = x
        zw = r.Z0[..., dm.hk : dm.write_cols]
        M_in = M if kp is None else M * rowwise(kp, M)
        return write(dm, r.zk, zw, fw["a"], M_in)[0], M

    return jax.lax.scan(body, M0, (res, keep_SxB), unroll=dm.unroll)[1]


def _zeros_like_tree(dm: Dims, name: str, t):
    return jax.tree.map(
        lambda x: along(dm, jnp.zeros(x.shape, jnp.float32), BLOCK_DIM.get(name)), t
    )


def window_bwd(dm: Dims, saved, cts):
    """The window's VJP: (d fused weights, ds0, dzk0, dM0, dxg) from the forward's `saved`."""
    fw, xg, starts, res_all, MT, keep = saved
    dsT, dMT, dP, dG = cts
    S, B = dm.segment, xg.shape[1]
    dP = segments(dP, S)
    dG = segments(dG, S) if dm.memory else jnp.zeros((dP.shape[0], S, B, 0), jnp.float32)
    names = ("W0", "b0", "Wl", "bl", "W2o", "Wg", "bg", "Wpg", "bpg")
    gW = {k: _zeros_like_tree(dm, k, fw[k]) for k in names}
    zk_shape = (B, *fw["b0"][..., : dm.hk].shape)
    fwT = loop_weights(dm, transposed(dm, fw))
    fw = with_halves(dm, fw)  # tp > 1: the layers' [W2; Wo] halves, sliced once per window
    fwh = loop_weights(dm, fw)

    def seg(carry, xs):
        if _stack_parts(dm) > 1:
            return _segment_in_parts(dm, fw, fwT, fwh, carry, xs)
        ds, dzk, dM, Mn, da, gw = carry
        start, res, dp_seg, dg_seg, xg_seg, keep_seg = xs
        res, Ms, stack = _segment_memories(dm, fw, fwh, start, res, xg_seg, keep_seg)
        (ds, dzk, dM, Mn, da), e = _reverse_steps(
            dm, fw, fwT, stack, (ds, dzk, dM, Mn, da), (res, Ms, dp_seg, dg_seg, keep_seg)
        )
        if dm.remat and dm.remat_parallel:
            e |= inputs_at_once(res, e["dxg"])
        return (ds, dzk, dM, Mn, da, _add_weight_grads(dm, fw, gw, e)), e["dxg"]

    init = (
        dsT,
        along(dm, jnp.zeros(zk_shape, jnp.float32), 1, batch=True) if dm.memory else None,
        along(dm, dMT, 1, batch=True),
        None if dm.kernel_backward else along(dm, MT, 1, batch=True),  # the kernels read `stack`
        along(dm, jnp.zeros((B, *fw["a"].shape), jnp.float32), 1, batch=True),  # da per row
        gW,
    )
    xs = (starts, res_all, dP, dG, segments(xg, S), segments(keep, S))
    (ds0, dzk0, dM0, _, da, gw), dxg = jax.lax.scan(seg, init, xs, reverse=True)
    dfw = {k: jax.tree.map(lambda g, w: g.astype(w.dtype), gw[k], fw[k]) for k in gw}
    dfw["a"] = da.sum(axis=0)
    return dfw, ds0, dzk0, dM0, unsegment(dxg)


def _reverse_steps(dm: Dims, fw, fwT, stack, bc, xs):
    """A segment's reverse scan of `bstep` over xs = (res, memories, dp, dg, keep). With the
    kernels' `stack` the memories are (kM, qM) per step and the step's index t into the stack
    counts down in the carry: read from a per-step array instead, XLA:GPU slices it at every
    step in a kernel of its own."""
    if stack is None:
        return jax.lax.scan(
            partial(bstep, dm, fw, fwT, None), bc, xs, reverse=True, unroll=dm.unroll
        )

    def body(carry, x):
        bc, t = carry
        res, (kM, qM), *rest = x
        bc, e = bstep(dm, fw, fwT, stack, bc, (res, (t, kM, qM), *rest))
        return (bc, t - 1), e

    n = xs[1][0].shape[0]
    (bc, _), e = jax.lax.scan(body, (bc, jnp.int32(n - 1)), xs, reverse=True, unroll=dm.unroll)
    return bc, e


def _stack_parts(dm: Dims) -> int:
    """How many parts a rerun segment's backward takes with the kernels' passes: two where the
    segment halves, so that one half's stack of memories (S/2 of them, the backward's largest
    buffer) is alive at a time; one otherwise (`remat_parallel` reruns no memory, so a part's
    start is not at hand: a smaller `remat_segment` bounds its stack instead)."""
    halves = dm.remat and not dm.remat_parallel and dm.kernel_backward and dm.segment % 2 == 0
    return 2 if halves else 1


def _segment_in_parts(dm: Dims, fw, fwT, fwh, carry, xs):
    """`window_bwd`'s segment in `_stack_parts` parts, last to first: the forward reruns part by
    part (the carry between parts is each part's starting memory, so no extra pass over M), then
    each part's `stack` is built only after the later part's backward is done (an optimization
    barrier orders them) and read by its reverse scan. Same memory traffic per token as one part."""
    ds, dzk, dM, Mn, da, gw = carry
    start, _, dp_seg, dg_seg, xg_seg, keep_seg = xs
    n = _stack_parts(dm)
    h = dm.segment // n

    def part(x, i):
        return None if x is None else x[i * h : (i + 1) * h]

    starts, runs = [start], []
    for i in range(n):
        new, (_, res) = scan_steps(dm, fwh, starts[-1], part(xg_seg, i), "res", part(keep_seg, i))
        starts.append(new)
        runs.append(res)
    bc, dxg = (ds, dzk, dM, Mn, da), []
    for i in reversed(range(n)):
        M0, bc = jax.lax.optimization_barrier((starts[i][2], bc))
        stack, kM, qM = memory_stack(dm, fw, M0, runs[i], part(keep_seg, i))
        bc, e = _reverse_steps(
            dm,
            fw,
            fwT,
            stack,
            bc,
            (runs[i], (kM, qM), part(dp_seg, i), part(dg_seg, i), part(keep_seg, i)),
        )
        gw = _add_weight_grads(dm, fw, gw, e)
        dxg.insert(0, e["dxg"])
    return (*bc, gw), jnp.concatenate(dxg, axis=0)


def _segment_memories(dm: Dims, fw, fwh, start, res, xg_seg, keep_seg):
    """A segment's (residuals, what `bstep` reads per step for the memory, `stack`): with remat
    the forward reruns (for residuals and memories, or residuals only when the kernels rebuild
    the memories; with `remat_parallel` all steps at once, `rerun_at_once`); with the kernels'
    backward passes their `stack` and (kM, qM) per step; else the memories recomputed (None
    without memory)."""
    if dm.remat and dm.remat_parallel:
        res = rerun_at_once(dm, fw, start, res, xg_seg, keep_seg)
    elif dm.remat and not dm.kernel_backward:
        _, (_, res, Ms) = scan_steps(dm, fwh, start, xg_seg, "resM", keep_seg)
        return res, Ms, None
    elif dm.remat:  # rerun for the residuals only: the kernels' `stack` rebuilds the memories
        _, (_, res) = scan_steps(dm, fwh, start, xg_seg, "res", keep_seg)
    if dm.kernel_backward:  # the stack is read in place by the kernels' passes (`memory_bwd`)
        stack, kM, qM = memory_stack(dm, fw, start[2], res, keep_seg)
        return res, (kM, qM), stack
    if dm.memory:
        return res, recompute_memory(dm, fw, start[2], res, keep_seg), None
    return res, None, None


def rerun_at_once(dm: Dims, fw: dict, start, kept, xg_SxBxD, keep_SxB=None) -> Res:
    """A segment's residuals (`Res`, each with a leading S axis) from the fused weights (with
    `with_halves`' [W2; Wo] halves where tp > 1, as the forward's step), the carry entering it and
    what the forward kept of it (`remat_parallel`): its predicted states P (S, B, D) and the
    memory reads (S, B, hu) of each layer but the last (whose output is P). Given the reads no
    step waits on the one before: the state entering step t + 1 is ground(p_t) + xg_t, and the
    key entering it is W0's output at step t, so every product runs once over the segment's
    S * B rows. The memories are rebuilt by the caller (the kernels' `stack`, or
    `recompute_memory`)."""
    P, reads = kept
    s0, zk0, _ = start
    zg = cols(rms(P), fw["Wg"]) + fw["bg"]
    s = jnp.concatenate([s0[None], (jax.nn.sigmoid(zg) * P + xg_SxBxD)[:-1]])
    if keep_SxB is not None:
        s = s * rowwise(keep_SxB, s)
    x = rms(s)
    Z0 = cols(x, fw["W0"]) + fw["b0"]
    zk = None
    if dm.memory:
        zk = jnp.concatenate([zk0[None], Z0[:-1, ..., : dm.hk]])
        if keep_SxB is not None:
            k = rowwise(keep_SxB, zk)
            zk = zk * k + (1 - k) * fw["b0"][..., : dm.hk]

    def read(i, Zl):  # the last layer's output (P) is not rerun: its read is a stand-in
        return reads[i] if i < len(reads) else jnp.zeros((*Zl.shape[:-1], dm.hu), Zl.dtype)

    _, cs, Zs, zpgs, split_reads, _ = layers(dm, fw, s, x, Z0, read if dm.memory else None, None)
    return Res(s, zk, Z0, cs, Zs, P, zg, zpgs, split_reads)


def inputs_at_once(res: Res, dxg: Array) -> dict:
    """`AT_ONCE` of a segment rerun at once, from `rerun_at_once`'s residuals and the state's
    cotangents dxg (leading S axis), as `bstep` would emit them step by step: its per-token
    loop then stores only what the step's own pass yields (cotangents, each layer's X2)."""
    sg = jax.nn.sigmoid(res.zg)
    return {
        "X0": rms(res.s),
        "Xg": rms(res.p),
        "dZg": dxg * res.p * sg * (1 - sg),  # as `_ground_bwd`
        "Xl": [rms(c) for c in res.c],
    }


def _add_weight_grads(dm: Dims, fw: dict, gw: dict, e: dict) -> dict:
    """`gw` plus a segment's weight gradients, each one product over its emitted pairs."""

    def summed(name, xs, dzs):
        return [g + wgrad(x, d, w) for g, x, d, w in zip(gw[name], xs, dzs, fw[name], strict=True)]

    gw = dict(gw)
    gw["W0"] = gw["W0"] + wgrad(e["X0"], e["dZ0"], fw["W0"])
    gw["b0"] = gw["b0"] + bias_grad(e["dZ0"])
    if "dbk" in e:
        gw["b0"] = gw["b0"].at[..., : dm.hk].add(bias_grad(e["dbk"]))
    gw["Wg"] = gw["Wg"] + wgrad(e["Xg"], e["dZg"], fw["Wg"])
    gw["bg"] = gw["bg"] + bias_grad(e["dZg"])
    gw["W2o"] = summed("W2o", e["X2"], e["dY"])
    gw["Wl"] = summed("Wl", e["Xl"], e["dZl"])
    gw["bl"] = [g + bias_grad(d) for g, d in zip(gw["bl"], e["dZl"], strict=True)]
    gate_inputs = [e["X0"], *e["Xl"]][: len(e["dZpg"])]  # each layer's rms(c_in)
    gw["Wpg"] = summed("Wpg", gate_inputs, e["dZpg"])
    gw["bpg"] = [g + bias_grad(d) for g, d in zip(gw["bpg"], e["dZpg"], strict=True)]
    return gw
