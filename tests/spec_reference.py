"""A plain NumPy, per-token, per-sequence GPN / GPN+M written from the paper's equations alone.

Deliberately independent of `gpn_jax.core`: no shared helpers, float64 throughout,
one sequence at a time, explicit loops over heads. Only the parameter names are shared.
"""

import numpy as np


def rms(x):
    return x / np.sqrt(np.mean(x**2, -1, keepdims=True) + 1e-6)


def norm(x, w):
    return rms(x) * w


def l2n(x):
    return x / np.sqrt(np.sum(x**2, -1, keepdims=True) + 1e-12)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def softplus(x):
    return np.log1p(np.exp(x))


def relu(x):
    return np.maximum(x, 0.0)


def log_softmax(z):
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def write(w, s_prev, s, M):
    H, dk, dv = M.shape
    a, b = norm(s_prev, w["norm"]), norm(s, w["norm"])
    k = l2n(relu(a @ w["wk"] + w["bk"]).reshape(H, dk))
    v = (b @ w["wv"]).reshape(H, dv)
    beta = sigmoid(b @ w["wbeta"])
    g = -np.exp(w["A_log"]) * softplus(b @ w["wa"] + w["dt_bias"])
    M_new = np.empty_like(M)
    for h in range(H):
        kM = k[h] @ M[h]  # uses the old, undecayed memory
        M_new[h] = np.exp(g[h]) * M[h] + beta[h] * np.outer(k[h], v[h] - kM)
    return M_new


def read(lp, c, M):
    H, dk, dv = M.shape
    r = norm(c, lp["read_norm"])
    q = l2n(relu(r @ lp["wq"] + lp["bq"]).reshape(H, dk))
    o = np.stack([q[h] @ M[h] for h in range(H)]).reshape(-1)
    return (silu(r @ lp["wrg"]) * norm(o, lp["out_norm"])) @ lp["wo"]


def layer(lp, c, M):
    n = norm(c, lp["ffn_norm"])
    ffn = (silu(n @ lp["w1"]) * (n @ lp["w3"])) @ lp["w2"]
    pg = sigmoid(norm(c, lp["pg_norm"]) @ lp["wpg"] + lp["bpg"])
    out = pg * c + ffn
    if M is not None:
        out = out + read(lp, c, M)
    return out


def run_sequence(params, tokens, state=None):
    """Returns (logits (T, V), per-token CE (T,), final state (s, s_prev, M))."""
    p64 = {k: _f64(v) for k, v in params.items()}
    memory = "write" in p64
    d = p64["ground"]["gate_b"].shape[0]
    n_layers = sum(k.startswith("layer_") for k in p64)
    if state is None:
        s, s_prev = np.zeros(d), np.zeros(d)
        if memory:
            H = p64["write"]["A_log"].shape[0]
            dk = p64["write"]["wk"].shape[1] // H
            dv = p64["write"]["wv"].shape[1] // H
            M = np.zeros((H, dk, dv))
        else:
            M = None
    else:
        s, s_prev, M = state
    logits, ces = [], []
    for x in tokens:
        M_new = write(p64["write"], s_prev, s, M) if memory else None
        c = s
        for i in range(n_layers):
            c = layer(p64[f"layer_{i}"], c, M_new)
        p = c
        dp = p64["decode"]
        z = norm(p, dp["norm"]) @ dp["proj"] + dp.get("bias", 0.0)
        lg = z @ p64["embed"].T
        logits.append(lg)
        ces.append(-log_softmax(lg)[x])
        gp = p64["ground"]
        s_new = (
            sigmoid(norm(p, gp["gate_norm"]) @ gp["gate_w"] + gp["gate_b"]) * p
            + norm(p64["embed"][x], gp["emb_norm"]) @ gp["fuse"]
        )
        s, s_prev, M = s_new, s, M_new
    return np.stack(logits), np.array(ces), (s, s_prev, M)


def _f64(tree):
    if isinstance(tree, dict):
        return {k: _f64(v) for k, v in tree.items()}
    return np.asarray(tree, dtype=np.float64)
