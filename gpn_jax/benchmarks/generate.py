"""Generation records: per-token decoding latency after long contexts.

Recurrent models (GPN / GPN+M, Gated DeltaNet) really read the context: it is fed through
the training-window forward pass at batch 1, `feed_window` tokens at a time with the carry
passed on, and the state after 1k / 8k / 32k tokens is kept. Their decoding state has the
same size at any context, so a batch-B state is the batch-1 state broadcast (B copies of the
same context); the measured step does the same work either way.

Transformer++ decodes against a KV cache of `max_seq_len` = context + the decoded tokens.
Filling it for real needs a 32k-token causal attention prefill, which does not fit on a
CPU; the cache is therefore filled with random keys and values and its position set to the
context length. Attention cost does not depend on the cache contents, so the latency is that
of a real cache of that length. Caches larger than `kv_cache_limit_bytes` are not built: the
record says `skipped` and why.

Each context is timed in `rounds` interleaved rounds of `steps` single-token calls (greedy
argmax inside the jitted step), so load on a shared machine hits every context alike; the
latency is the median call.
"""

import math

import jax
import jax.numpy as jnp

from gpn_jax.benchmarks import measure
from gpn_jax.models import factory


def _greedy_step(model):
    def step(params, state, token):
        logits, state = model.decode_step(params, state, token)
        return jnp.argmax(logits, -1).astype(jnp.int32), state

    return step


def _feed_recurrent(model, params, contexts, feed_window):
    """Carry after each context length (batch 1), feeding random tokens window by window."""
    family = type(model).__name__
    if family == "GPN":
        window = jax.jit(lambda p, x, c: model.predicted_states(p, x, c)[1])
    else:
        window = jax.jit(lambda p, x, c: model.token_losses(p, x, c)[1])
    total = max(contexts)
    w = math.gcd(feed_window, *contexts)
    carry = model.init_state(1)
    carries, fed = {}, 0
    key = jax.random.PRNGKey(2)
    while fed < total:
        key, sub = jax.random.split(key)
        x = jax.random.randint(sub, (1, w), 0, model.config.vocab_size)
        carry = window(params, x, carry)
        fed += w
        if fed in contexts:
            carries[fed] = jax.block_until_ready(carry)
    return carries


def _broadcast(tree, batch):
    return jax.tree.map(
        lambda a: a if a.ndim == 0 else jnp.array(jnp.broadcast_to(a, (batch, *a.shape[1:]))),
        tree,
    )


def _transformer_context(spec, dtype, base, ctx):
    """(record, runner or None) of one context: a KV cache of that length, randomly filled."""
    B, warmup = spec["batch_size"], spec.get("warmup", 2)
    max_len = ctx + warmup + spec["rounds"] * spec["steps"] + 1
    model = measure.build_model(spec["model"], dtype, max_seq_len=max_len)
    c = model.config
    cache_bytes = 2 * c.n_layers * B * max_len * c.d_model * jnp.dtype(dtype).itemsize
    rec = base | dict(
        context=ctx,
        state_bytes=cache_bytes,
        flops_per_token=model.flops_per_token(2 * ctx)["forward"],
    )
    limit = spec["kv_cache_limit_bytes"]
    if cache_bytes > limit:
        why = f"KV cache {cache_bytes / 2**30:.1f} GiB > limit {limit / 2**30:.1f} GiB"
        return rec | dict(skipped=why), None
    params = model.init(jax.random.PRNGKey(0))
    shape = (c.n_layers, B, max_len, c.n_heads, c.head_dim)
    k1, k2 = jax.random.split(jax.random.PRNGKey(3))
    state = {
        "k": jax.random.normal(k1, shape, jnp.float32).astype(dtype),
        "v": jax.random.normal(k2, shape, jnp.float32).astype(dtype),
        "pos": jnp.asarray(ctx, jnp.int32),
    }
    fn = jax.jit(_greedy_step(model), donate_argnums=1)
    runner = [fn, params, state, jnp.zeros((B,), jnp.int32)]
    note = "KV cache filled with random keys/values (content-independent cost)"
    return rec | dict(note=note), runner


def _transformer_runners(spec, dtype, base, contexts):
    records, runners = [], {}
    for ctx in contexts:
        rec, runner = _transformer_context(spec, dtype, base, ctx)
        records.append(rec)
        if runner is not None:
            runners[ctx] = runner
    return records, runners


def _recurrent_runners(spec, dtype, base, contexts):
    """Records and runners of a recurrent model: the context really fed, then decoded from."""
    B = spec["batch_size"]
    model = measure.build_model(spec["model"], dtype)
    params = model.init(jax.random.PRNGKey(0))
    carries = _feed_recurrent(model, params, contexts, spec.get("feed_window", 1024))
    start = jax.jit(lambda p, c: model.start_decode(p, c))
    fn = jax.jit(_greedy_step(model), donate_argnums=1)
    records, runners = [], {}
    for ctx in contexts:
        carry = carries[ctx] if B == 1 else _broadcast(carries[ctx], B)
        logits, state = start(params, carry)
        token = jnp.argmax(logits, -1).astype(jnp.int32)
        runners[ctx] = [fn, params, state, token]
        state_bytes = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(carry))
        note = "context fed through the window forward" + (
            f" at batch 1, state broadcast to batch {B}" if B > 1 else ""
        )
        flops = model.flops_per_token(ctx)["forward"]
        records.append(
            base | dict(context=ctx, state_bytes=state_bytes, note=note, flops_per_token=flops)
        )
    return records, runners


def _time(runners: dict, warmup: int, rounds: int, steps: int) -> dict:
    """{context: call times}, contexts interleaved in `rounds` rounds of `steps` calls."""

    def call(ctx):
        r = runners[ctx]
        r[3], r[2] = r[0](r[1], r[2], r[3])
        return r[3]

    for ctx in runners:
        for _ in range(warmup):
            jax.block_until_ready(call(ctx))
    times = {ctx: [] for ctx in runners}
    for _ in range(rounds):
        for ctx in runners:
            times[ctx] += measure.time_calls(lambda ctx=ctx: call(ctx), steps)
    return times


def run(spec: dict) -> list[dict]:
    """spec: name, config, model, batch_size, contexts, steps, rounds, warmup, compute_dtype,
    feed_window, kv_cache_limit_bytes."""
    dtype = measure.resolve_dtype(spec["compute_dtype"])
    B, contexts = spec["batch_size"], sorted(spec["contexts"])
    family = factory.family_name(spec["model"])
    base = dict(
        model=spec["name"],
        config=spec["config"],
        suite="generate",
        family=family,
        batch_size=B,
        compute_dtype=dtype,
    )
    recurrent = factory.FAMILIES[family].recurrent
    runners_of = _recurrent_runners if recurrent else _transformer_runners
    records, runners = runners_of(spec, dtype, base, contexts)
    times = _time(runners, spec.get("warmup", 2), spec["rounds"], spec["steps"])
    mem, mem_kind = measure.peak_memory_bytes()
    for rec in records:
        ts = times.get(rec["context"])
        if not ts:
            continue
        lat = measure.median(ts)
        rec.update(
            latency_s=lat,
            latency_min_s=min(ts),
            tokens_per_s=B / lat,
            achieved_flops=rec["flops_per_token"] * B / lat,
            peak_mem_bytes=mem,
            peak_mem_kind=mem_kind,
        )
    return records
