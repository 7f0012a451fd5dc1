"""The gated delta rule (Gated DeltaNet's token mixer) in recurrent and chunkwise-parallel form.

Pure JAX, float32 throughout. Shape key: B batch, T time, H heads, K key width, U value
width, N chunks, C chunk length. Per head, with state S (K, U) and per-step inputs
q, k (K), v (U), beta (scalar in [0, 1], or [0, 2] for the negative-eigenvalue variant of
Grazzi et al. 2024: with unit-norm k the transition I - beta k k^T then has eigenvalue
1 - beta in [-1, 1]) and g (scalar log-decay, g <= 0), one step in the
order of flash-linear-attention:

    S' = exp(g) S                 # decay first
    u  = beta (v - S'^T k)        # delta-rule correction against the decayed state
    S  = S' + k u^T
    o  = S^T (q * scale)          # read after the write; scale = K^-1/2 by default

`recurrent` scans this step over time (decoding and the reference oracle); `chunked` computes
the same thing chunk by chunk. Inside a chunk, with G_i = sum_{l<=i} g_l and the
segment sums Gam_ij = sum_{j<l<=i} g_l (i >= j), the corrections of all positions satisfy the
unit lower-triangular system

    (I + A) U = diag(beta) V - diag(beta exp(G)) K S0,   A = strictly_lower(diag(beta) K K^T * exp(Gam))

so with the UT/WY transform  U~ = (I + A)^-1 diag(beta) V  and  W = (I + A)^-1 diag(beta exp(G)) K
(both independent of the incoming state, computed for all chunks in parallel):

    U  = U~ - W S0
    O  = diag(exp(G)) Q S0 + (Q K^T * lower_incl(exp(Gam))) U
    S1 = exp(G_C) S0 + (K * exp(Gam_{C,:}))^T U

and only these three lines run sequentially, in a `lax.scan` over chunks. The segment sums
are formed directly (a masked cumulative sum), never as differences of running sums, and
the exponent is masked before `exp`, so strong decay underflows to exact zeros without any
inf * 0 in either pass.
"""

import jax
import jax.numpy as jnp

Array = jax.Array


def _scale(q: Array, scale: float | None) -> float:
    return q.shape[-1] ** -0.5 if scale is None else scale


def step(state: Array, q: Array, k: Array, v: Array, beta: Array, g: Array, scale=None):
    """One token for any leading batch shape `...` (typically (B, H)).

    state (..., K, U); q, k (..., K); v (..., U); beta, g (...). Returns (o (..., U), new state).
    """
    f32 = lambda x: x.astype(jnp.float32)
    state, q, k, v, beta, g = map(f32, (state, q, k, v, beta, g))
    S = jnp.exp(g)[..., None, None] * state
    u = beta[..., None] * (v - jnp.einsum("...k,...ku->...u", k, S))
    S = S + k[..., :, None] * u[..., None, :]
    o = jnp.einsum("...k,...ku->...u", q * _scale(q, scale), S)
    return o, S


def _zero_state(q: Array, v: Array) -> Array:
    B, _, H, K = q.shape
    return jnp.zeros((B, H, K, v.shape[-1]), jnp.float32)


def recurrent(q, k, v, beta, g, initial_state=None, scale=None):
    """The step scanned over time.

    q, k (B, T, H, K); v (B, T, H, U); beta, g (B, T, H); initial_state (B, H, K, U) or None
    (zeros). Returns (o (B, T, H, U) float32, final state (B, H, K, U) float32).
    """
    S0 = _zero_state(q, v) if initial_state is None else initial_state.astype(jnp.float32)
    scale = _scale(q, scale)
    time_major = [jnp.moveaxis(x, 1, 0) for x in (q, k, v, beta, g)]

    def body(S, xs):
        o, S = step(S, *xs, scale=scale)
        return S, o

    S, o = jax.lax.scan(body, S0, time_major)
    return jnp.moveaxis(o, 0, 1), S


def _to_chunks(x: Array, n: int, c: int) -> Array:
    """(B, T, H, ...) -> (B, H, N, C, ...), zero-padding time up to N * C."""
    x = jnp.moveaxis(x.astype(jnp.float32), 1, 2)
    pad = [(0, 0)] * x.ndim
    pad[2] = (0, n * c - x.shape[2])
    x = jnp.pad(x, pad)
    return x.reshape(*x.shape[:2], n, c, *x.shape[3:])


def chunk_len(T: int, chunk_size: int) -> int:
    """The chunk length used for a window of T steps (one chunk when T <= chunk_size)."""
    return max(1, min(chunk_size, T))


def inverse_doublings(C: int) -> int:
    """Factors (I + N^(2^i)) needed to cover every power N^j, j < C, of a nilpotent N."""
    return max(1, (C - 1).bit_length())


def unit_lower_inverse(a: Array) -> Array:
    """(I + a)^-1 for strictly lower-triangular a (..., C, C), by matmuls only.

    With n = -a nilpotent (n^C = 0), (I - n)^-1 = sum_j n^j = prod_i (I + n^(2^i)), so
    ceil(log2 C) squarings and products give the exact inverse. We avoid
    `lax.linalg.triangular_solve` on purpose: its batched CPU kernel (jaxlib 0.10) waits on
    sub-tasks in the thread pool it runs in and deadlocks on small machines, and matmuls
    are what accelerators do fastest anyway.
    """
    eye = jnp.eye(a.shape[-1], dtype=a.dtype)
    power = -a
    inverse = eye + power
    for _ in range(inverse_doublings(a.shape[-1]) - 1):
        power = power @ power
        inverse = inverse @ (eye + power)
    return inverse


def chunked(q, k, v, beta, g, initial_state=None, scale=None, chunk_size=64):
    """Chunkwise-parallel gated delta rule; same arguments and results as `recurrent`
    (nothing assumes beta <= 1: the UT transform is exact for any beta).

    A partial last chunk is padded with q = k = v = 0, beta = 0 and g = 0, which leaves the
    state untouched, so outputs and final state do not depend on the padding.
    """
    B, T, H, K = q.shape
    U = v.shape[-1]
    C = chunk_len(T, chunk_size)
    N = -(-T // C)
    S0 = _zero_state(q, v) if initial_state is None else initial_state.astype(jnp.float32)

    q = _to_chunks(q, N, C) * _scale(q, scale)  # (B, H, N, C, K)
    k = _to_chunks(k, N, C)
    v = _to_chunks(v, N, C)  # (B, H, N, C, U)
    beta = _to_chunks(beta, N, C)  # (B, H, N, C)
    g = _to_chunks(g, N, C)

    idx = jnp.arange(C)
    strict = idx[:, None] > idx[None, :]  # (i, j): i > j
    lower = idx[:, None] >= idx[None, :]
    # gam[i, j] = sum_{j < l <= i} g_l (0 on and above the diagonal), a masked cumulative sum.
    gam = jnp.cumsum(jnp.where(strict, g[..., :, None], 0.0), axis=-2)  # (B, H, N, C, C)
    decay = jnp.where(lower, jnp.exp(jnp.where(lower, gam, 0.0)), 0.0)
    G = jnp.cumsum(g, axis=-1)  # (B, H, N, C), from the chunk start, inclusive
    eG = jnp.exp(G)

    # UT transform: U~ and W for every chunk at once, by one unit lower-triangular inverse.
    kk = jnp.einsum("...ik,...jk->...ij", k, k)
    eye = jnp.eye(C, dtype=jnp.float32)
    system = eye + jnp.where(strict, beta[..., :, None] * kk * decay, 0.0)
    rhs = jnp.concatenate([beta[..., None] * v, (beta * eG)[..., None] * k], axis=-1)
    sol = unit_lower_inverse(system - eye) @ rhs
    u_tilde, w = sol[..., :U], sol[..., U:]

    qk = jnp.einsum("...ik,...jk->...ij", q, k) * decay  # intra-chunk attention, lower incl.
    q_decayed = q * eG[..., None]  # reads the incoming state, decayed to each position
    k_decayed = k * jnp.exp(gam[..., C - 1, :])[..., None]  # decayed to the chunk end
    g_chunk = eG[..., C - 1]  # (B, H, N) total decay of a chunk

    def body(S, xs):
        ut, w, qk, qd, kd, gc = xs
        u = ut - jnp.einsum("...ck,...ku->...cu", w, S)
        o = jnp.einsum("...ck,...ku->...cu", qd, S) + jnp.einsum("...cd,...du->...cu", qk, u)
        S = gc[..., None, None] * S + jnp.einsum("...ck,...cu->...ku", kd, u)
        return S, o

    chunk_major = [jnp.moveaxis(x, 2, 0) for x in (u_tilde, w, qk, q_decayed, k_decayed, g_chunk)]
    S, o = jax.lax.scan(body, S0, chunk_major)  # o (N, B, H, C, U)
    o = jnp.moveaxis(o, 0, 2).reshape(B, H, N * C, U)[:, :, :T]
    return jnp.moveaxis(o, 1, 2), S


def flops_per_token(n_heads: int, d_key: int, d_value: int, chunk: int) -> int:
    """Matmul FLOPs per token (2 per multiply-add) of `chunked`'s forward pass, chunk length C.

    Per head: K K^T and Q K^T (C K each), the unit-lower inverse (2 log2 C - 1 products of
    C x C matrices, per chunk: (2 log2 C - 1) C^2 per token) and its product with [V, K]
    (C (K + U)), W S0, Q S0 and the state update (K U each), and the intra-chunk read (C U).
    """
    C, K, U = chunk, d_key, d_value
    inverse = (2 * inverse_doublings(C) - 1) * C * C
    macs = 2 * C * K + inverse + C * (K + U) + 3 * K * U + C * U
    return 2 * n_heads * macs
