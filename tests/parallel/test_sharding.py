"""Scale-out on 8 forced CPU devices: sharding rules, equivalence with one device, and the
compiled recurrence (no per-token weight all-gather / gradient reduce-scatter)."""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from jax import P

from gpn_jax.models import factory
from gpn_jax.parallel import hlo, spmd
from gpn_jax.parallel import mesh as meshlib
from gpn_jax.parallel import sharding as shardlib
from gpn_jax.training import setup
from gpn_jax.training import train_step as ts
from gpn_jax.training.optimizer import make_optimizer
from tests.environment import PRODUCTION_HLO
from tests.tolerance import assert_rel_close, f32_bound, rel_err

# data parallel; data + fsdp; all three axes (the smallest mesh of each kind: compiles and runs of
# 8 devices cost more on 2 cores, and a split of 2 exercises the same partial sums)
MESHES = [(2, 1, 1), (2, 2, 1), (2, 2, 2)]
B, T = 8, 8


# Float32 bound (tests/tolerance.py) for sharded vs one device, every reduction split into partial
# sums added in another order. The longest chain of dependent roundings: T recurrent steps of
# reductions no longer than d_ffn = 32, the 64-way vocabulary logsumexp, then the mean over the
# tokens (the gradients' sum over them); x4 for the backward pass retracing the chain.
def sharded_bound(tokens: int = B * T, steps: int = T) -> float:
    return f32_bound(steps * 32 + 64 + tokens, 4)


MODELS = {
    "gpn_m": dict(
        family="gpn", vocab_size=64, d_model=16, d_emb=8, d_ffn=32, n_heads=2, d_key=4,
        d_value=8, n_layers=1, loss_chunk=4, scan_impl="autodiff",
    ),
    "transformer": dict(
        family="transformer", vocab_size=64, d_model=16, n_layers=1, n_heads=2, d_ffn=32,
        max_seq_len=T, loss_chunk=4,
    ),
    "gpn_m_2l": dict(
        family="gpn", vocab_size=64, d_model=16, d_emb=8, d_ffn=32, n_heads=2, d_key=4,
        d_value=8, n_layers=2, loss_chunk=4, scan_impl="autodiff",
    ),
    "gpn_m_fused": dict(
        family="gpn", vocab_size=64, d_model=16, d_emb=8, d_ffn=32, n_heads=2, d_key=4,
        d_value=8, n_layers=1, loss_chunk=4, scan_impl="fused",
    ),
    "gpn_m_fused_pallas": dict(
        family="gpn", vocab_size=64, d_model=16, d_emb=8, d_ffn=32, n_heads=2, d_key=4,
        d_value=8, n_layers=1, loss_chunk=4, scan_impl="fused", kernels="pallas",
    ),
    "gpn_m_fused_xla": dict(
        family="gpn", vocab_size=64, d_model=16, d_emb=8, d_ffn=32, n_heads=2, d_key=4,
        d_value=8, n_layers=1, loss_chunk=4, scan_impl="fused", kernels="xla",
    ),
    "gpn_m_fused_at_once": dict(
        family="gpn", vocab_size=64, d_model=16, d_emb=8, d_ffn=32, n_heads=2, d_key=4,
        d_value=8, n_layers=1, loss_chunk=4, scan_impl="fused", kernels="pallas",
        remat_segment=4, remat_parallel=True,
    ),
    "gpn_m_2l_fused": dict(
        family="gpn", vocab_size=64, d_model=16, d_emb=8, d_ffn=32, n_heads=2, d_key=4,
        d_value=8, n_layers=2, loss_chunk=4, scan_impl="fused", remat_segment=4,
    ),
    "gpn_m_4h_fused": dict(
        family="gpn", vocab_size=64, d_model=16, d_emb=8, d_ffn=32, n_heads=4, d_key=2,
        d_value=4, n_layers=2, loss_chunk=4, scan_impl="fused",
    ),
    "gpn_fused": dict(
        family="gpn", vocab_size=64, d_model=16, d_emb=8, d_ffn=32, n_layers=2, memory=False,
        n_heads=0, d_key=0, d_value=0, loss_chunk=4, scan_impl="fused",
    ),
    "gdn": dict(
        family="gdn", vocab_size=64, d_model=16, n_layers=1, n_heads=2, d_key=4, d_value=8,
        d_ffn=32, chunk_size=4, loss_chunk=4,
    ),
}  # fmt: skip


def make_mesh(shape):
    """A mesh of `shape` over the first prod(shape) of the 8 forced devices."""
    cfg = ml_collections.ConfigDict(dict(zip(meshlib.AXES, shape, strict=True)))
    return meshlib.make_mesh(cfg, jax.devices()[: int(np.prod(shape))])


# ----------------------------------------------------------------------------- mesh and rules
def test_mesh_shape_from_config():
    cfg = lambda **kw: ml_collections.ConfigDict(kw)
    assert meshlib.mesh_shape(cfg(data=-1, fsdp=1, tensor=1), 8) == (8, 1, 1)
    assert meshlib.mesh_shape(cfg(data=2, fsdp=-1, tensor=2), 8) == (2, 2, 2)
    with pytest.raises(ValueError, match="at most one"):
        meshlib.mesh_shape(cfg(data=-1, fsdp=-1), 8)
    with pytest.raises(ValueError, match="needs 4 devices"):
        meshlib.mesh_shape(cfg(data=2, fsdp=2, tensor=1), 8)
    mesh = make_mesh((2, 4, 1))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 4, "tensor": 1}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
    with pytest.raises(ValueError, match="does not split into 2 micro-batch"):
        meshlib.check_batch(mesh, 8, grad_accum=2)


def test_rules_shard_params_and_follow_them_into_the_optimiser_state():
    model = factory.build_model(MODELS["gpn_m"])
    opt = make_optimizer(ml_collections.ConfigDict(_train_cfg()), model.weight_decay_mask)
    state = jax.eval_shape(lambda r: ts.init_train_state(model, opt, r), jax.random.PRNGKey(0))
    specs = shardlib.tree_specs(state, make_mesh((2, 2, 2)), shardlib.layout_of(model))
    p = specs.params
    assert p["layer_0"]["w1"] == p["layer_0"]["w3"] == P("fsdp", "tensor")  # column-parallel
    assert p["layer_0"]["w2"] == P("tensor", "fsdp")  # row-parallel
    assert p["layer_0"]["wq"] == P("fsdp", "tensor")  # memory heads split
    assert p["layer_0"]["wo"] == P("tensor", "fsdp")
    assert p["write"]["A_log"] == P("tensor")
    assert p["embed"] == P("tensor", "fsdp")  # vocab over tensor
    assert p["layer_0"]["wpg"] == P("fsdp")  # whole on tensor
    assert p["layer_0"]["ffn_norm"] == P()  # vectors replicated
    mu = specs.opt_state[1][0].mu
    assert mu == p  # Adam moments follow their parameters
    assert specs.step == P()


def test_specs_drop_axes_that_do_not_divide():
    mesh_shape = {"data": 1, "fsdp": 4, "tensor": 2}
    # 3 heads cannot split over tensor=2, even though 3 * 4 = 12 columns could.
    sizes = {"heads": 3, "ffn": 32, "vocab": 64}
    assert shardlib.fit_spec(("embed", "heads"), (16, 12), mesh_shape, sizes) == P("fsdp")
    assert shardlib.fit_spec(("embed", "ffn"), (16, 64), mesh_shape, sizes) == P("fsdp", "tensor")
    assert shardlib.fit_spec(("vocab", "embed"), (63, 8), mesh_shape, sizes) == P(None, "fsdp")
    # unmatched matrices: fsdp on the first divisible dimension; vectors replicated
    assert shardlib.spec_for("x/unknown", (3, 8), mesh_shape) == P(None, "fsdp")
    assert shardlib.spec_for("x/unknown", (8,), mesh_shape) == P()
    # config rules come first and may name logical or mesh axes
    rules = shardlib.rules_from_config(
        ml_collections.ConfigDict({"rules": [[r"(^|/)wpg$", ["tensor", None]]]})
    )
    assert shardlib.spec_for("layer_0/wpg", (16, 16), mesh_shape, rules) == P("tensor")
    with pytest.raises(ValueError, match="unknown axis"):
        shardlib.rules_from_config(ml_collections.ConfigDict({"rules": [["w", ["model"]]]}))


def _train_cfg():
    return dict(
        grad_clip=1.0, learning_rate=1e-2, warmup_steps=0, steps=10, min_lr_ratio=0.1,
        b1=0.9, b2=0.95, weight_decay=0.1,
    )  # fmt: skip


# ----------------------------------------------------------------------------- equivalence
@functools.cache
def _problem(name):
    """Model, perturbed params (so no gradient is trivially zero), a batch, single-device
    loss and gradients."""
    model = factory.build_model(MODELS[name])
    params = model.init(jax.random.PRNGKey(0))
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
    params = jax.tree.unflatten(
        tree, [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    )
    tokens = jax.random.randint(jax.random.PRNGKey(2), (B, T), 0, MODELS[name]["vocab_size"])
    one = jax.devices()[0]
    params, tokens = jax.device_put((params, tokens), one)
    ref = jax.jit(jax.value_and_grad(lambda p, x: model.loss(p, x)[0]))(params, tokens)
    return model, params, tokens, jax.device_get(ref)


def _sharded_fn(name, shape):
    """The jitted loss-and-gradients of `name` on `shape`, and its sharded arguments."""
    model, params, tokens, _ = _problem(name)
    mesh = make_mesh(shape)
    shardings = shardlib.tree_shardings(params, mesh, shardlib.layout_of(model))
    sharded = spmd.DataParallel(model, mesh)
    batch = meshlib.batch_sharding(mesh)
    fn = jax.jit(
        lambda p, x: sharded.value_and_grad(p, x)[:2],
        in_shardings=(shardings, batch),
        out_shardings=(meshlib.replicated(mesh), shardings),
    )
    return fn, mesh, shardings, (jax.device_put(params, shardings), jax.device_put(tokens, batch))


@functools.cache
def _compiled(name, shape):
    """The compiled loss-and-gradients of `name` on `shape`, its mesh, shardings and arguments:
    as a user's (PRODUCTION_HLO) where a test reads its optimised HLO (`HLO_READ`), then the one
    compile serves the numbers too; with the tests' flags otherwise."""
    fn, mesh, shardings, args = _sharded_fn(name, shape)
    with jax.set_mesh(mesh):
        compiled = fn.lower(*args).compile(PRODUCTION_HLO if (name, shape) in HLO_READ else None)
    return compiled, mesh, shardings, args


@functools.cache
def _sharded(name, shape):
    """Loss and gradients on `shape`."""
    compiled, mesh, shardings, args = _compiled(name, shape)
    with jax.set_mesh(mesh):
        loss, grads = compiled(*args)
    assert jax.tree.map(lambda g: g.sharding, grads) == shardings
    return jax.device_get((loss, grads))


def _sharded_hlo(name, shape):
    """The optimised HLO of that computation, compiled as a user's (PRODUCTION_HLO)."""
    assert (name, shape) in HLO_READ, (name, shape)
    return _compiled(name, shape)[0].as_text()


def _assert_matches(name, shape):
    ref_loss, ref_grads = _problem(name)[3]
    loss, grads = _sharded(name, shape)
    # relative to each leaf's norm (tests/tolerance.py)
    assert rel_err(loss, ref_loss) <= sharded_bound()
    assert_rel_close(grads, ref_grads, sharded_bound(), f"{name} on {shape}")
    assert max(float(np.abs(g).max()) for g in jax.tree.leaves(ref_grads)) > 1e-2


@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "x".join(map(str, s)))
def test_gpn_m_loss_and_grads_match_one_device(shape):
    _assert_matches("gpn_m", shape)


@pytest.mark.parametrize("shape", MESHES[:2], ids=lambda s: "x".join(map(str, s)))
def test_fused_window_loss_and_grads_match_one_device(shape):
    """The custom-VJP window (scan_impl='fused') under data / fsdp: same loss and gradients,
    and no collective in any loop body (weights gathered before the scan)."""
    _assert_matches("gpn_m_fused", shape)
    for lp in hlo.while_loops(_sharded_hlo("gpn_m_fused", shape)):
        assert not lp.collectives, (lp.body, lp.trip_count, lp.op_names)


@pytest.mark.parametrize("kernels", ["xla", "pallas"])
@pytest.mark.parametrize("shape", MESHES[:2], ids=lambda s: "x".join(map(str, s)))
def test_memory_kernels_run_per_shard_under_data_and_fsdp(shape, kernels, monkeypatch):
    """With explicit `model.kernels`, the window's memory passes run per shard inside the
    batch axes' shard_map (the Pallas kernels interpreted here): the same loss and gradients as
    one device, and the Pallas passes were traced inside the sharded computation."""
    from gpn_jax import kernels as kernels_lib

    traced = []
    real = kernels_lib._pallas

    def counting(*args, **kw):
        got = real(*args, **kw)
        return got._replace(step=lambda *a: traced.append("step") or got.step(*a))

    kernels_lib._resolve.cache_clear()
    monkeypatch.setattr(kernels_lib, "_pallas", counting)
    try:
        _problem(f"gpn_m_fused_{kernels}")  # the one-device reference, traced first
        traced.clear()  # the pair's own first use: its sharded program is traced below
        _assert_matches(f"gpn_m_fused_{kernels}", shape)
    finally:
        kernels_lib._resolve.cache_clear()
    assert bool(traced) == (kernels == "pallas")


def test_rerun_at_once_runs_per_shard_under_data_and_fsdp():
    """`remat_parallel` with the Pallas passes (interpreted) on data 2 x fsdp 2: the rerun from
    each shard's kept reads gives one device's loss and gradients."""
    _assert_matches("gpn_m_fused_at_once", MESHES[1])


# The fused window under tensor parallelism (`core.fused.window`: tp-major column blocks): GPN+M
# 1 layer, 2 layers with remat segments, 4 heads on tensor = 4, and GPN without memory.
FUSED_TP = {
    "gpn_m_fused": (2, 2, 2),
    "gpn_m_2l_fused": (2, 2, 2),
    "gpn_m_4h_fused": (1, 2, 4),
    "gpn_fused": (1, 2, 4),
}


# (model, mesh) pairs whose optimised HLO a test reads (`_compiled`).
HLO_READ = {
    ("gpn_m", MESHES[0]), ("gpn_m", (2, 2, 2)), ("gpn_m_2l", (2, 2, 2)),
    *(("gpn_m_fused", shape) for shape in MESHES[:2]), *FUSED_TP.items(),
}  # fmt: skip


@pytest.mark.parametrize("name", list(FUSED_TP))
def test_fused_window_tensor_parallel_loss_and_grads_match_one_device(name):
    _assert_matches(name, FUSED_TP[name])


@pytest.mark.parametrize("name", ["gpn_m_fused", "gdn"])
def test_tensor_only_mesh_matches_one_device(name):
    """data = fsdp = 1, tensor = 2: no batch collective is emitted over the trivial manual
    axes (XLA's partitioner rejects such an all-reduce, for every family)."""
    _assert_matches(name, (1, 1, 2))


def test_fused_window_tensor_parallel_stateful_with_resets_and_accumulation():
    """Stateful training through the fused window on (2, 2, 2): a random incoming carry,
    document resets, 2 micro-batches per device; loss, gradients and final carry equal one
    device's."""
    model, params, tokens, _ = _problem("gpn_m_fused")
    keys = jax.random.split(jax.random.PRNGKey(7), 3)
    c = model.init_state(B)
    carry = c._replace(
        s=jax.random.normal(keys[0], c.s.shape),
        s_prev=jax.random.normal(keys[1], c.s.shape),
        M=0.3 * jax.random.normal(keys[2], c.M.shape),
    )
    resets = jnp.zeros((B, T), bool).at[1, 3].set(True).at[5, 6].set(True)

    def local(p, x, c, r):
        return jax.value_and_grad(lambda p: model.loss(p, x, c, resets=r), has_aux=True)(p)

    (ref_loss, (ref_carry, _)), ref_grads = jax.jit(local)(params, tokens, carry, resets)
    mesh = make_mesh((2, 2, 2))
    sharded = spmd.DataParallel(model, mesh, grad_accum=2)
    shardings = shardlib.tree_shardings(params, mesh, shardlib.layout_of(model))
    rows = jax.device_put((tokens, carry, resets), meshlib.batch_sharding(mesh))
    with jax.set_mesh(mesh):
        step = jax.jit(sharded.value_and_grad)
        loss, grads, final = step(jax.device_put(params, shardings), *rows)
    # two micro-batches of half the rows: the same chain, summed in another order
    assert rel_err(loss, ref_loss) <= sharded_bound()
    assert_rel_close(grads, ref_grads, sharded_bound(), "stateful gradients")
    assert_rel_close(final, ref_carry, sharded_bound(), "final carry")


def test_fused_window_refuses_heads_that_do_not_split_over_tensor():
    """2 memory heads cannot split over tensor = 4 (the fused window splits whole heads): the
    mesh is refused when the sharded model is built, before anything is traced."""
    model = factory.build_model(MODELS["gpn_m_fused"])
    with pytest.raises(ValueError, match=r"n_heads=2 and d_ffn=32 must be divisible by its si"):
        spmd.DataParallel(model, make_mesh((1, 2, 4)))


def test_fused_window_refuses_heads_and_ffn_on_different_axes():
    """Rules that split d_ffn but not the memory heads: the fused window's column blocks hold
    both, so it names the rules instead of resharding inside the per-token loop."""
    model = factory.build_model(MODELS["gpn_m_fused"])
    rules = shardlib.rules_from_config(ml_collections.ConfigDict({"axis_rules": {"heads": ""}}))
    with pytest.raises(ValueError, match=r"one mesh axis; these rules split \[\('ffn', 'tens"):
        spmd.DataParallel(model, make_mesh((2, 2, 2)), rules)
    assert spmd.DataParallel(model.autodiff(), make_mesh((2, 2, 2)), rules)  # autodiff: fine


@pytest.mark.parametrize(
    "shape",
    [pytest.param(s, marks=pytest.mark.slow) for s in MESHES[:2]] + MESHES[2:],
    ids=lambda s: "x".join(map(str, s)),
)
def test_transformer_loss_and_grads_match_one_device(shape):
    _assert_matches("transformer", shape)


@pytest.mark.slow
def test_gated_deltanet_loss_and_grads_match_one_device():
    """All three axes at once; data and fsdp alone are tests/training/test_stateful.py's
    sharded GDN step (data 4 x fsdp 2), tensor alone test_tensor_only_mesh_matches_one_device."""
    _assert_matches("gdn", (2, 2, 2))


def test_eval_token_losses_match_one_device():
    model, params, tokens, _ = _problem("gpn_m")
    ref, _ = jax.jit(model.token_losses)(params, tokens)
    mesh = make_mesh((2, 2, 2))
    shardings = shardlib.tree_shardings(params, mesh, shardlib.layout_of(model))
    sharded = spmd.DataParallel(model, mesh)
    with jax.set_mesh(mesh):
        ce, _ = jax.jit(sharded.token_losses)(
            jax.device_put(params, shardings),
            jax.device_put(tokens, meshlib.batch_sharding(mesh)),
        )
    assert ce.sharding.spec == P(("data", "fsdp"))
    assert_rel_close(ce, ref, sharded_bound(), "per-token CE")


# ----------------------------------------------------------------------------- compiled HLO
def _recurrent_loops(text: str, steps: int):
    """The while loops that run `steps` iterations: the recurrent scan forward and backward
    (the chunked-loss loop runs T / loss_chunk times, RNG loops a handful)."""
    loops = [lp for lp in hlo.while_loops(text) if lp.trip_count == steps]
    assert len(loops) >= 2, [(lp.body, lp.trip_count) for lp in hlo.while_loops(text)]
    return loops


def _fsdp_train_step(grad_accum: int, name: str = "gpn_m"):
    """GPN+M train step on (data 2, fsdp 2), the smallest mesh with both: (model, optimizer,
    abstract state, jitted step)."""
    config = dict(MODELS[name], loss_chunk=4)
    model = factory.build_model(config)
    opt = make_optimizer(ml_collections.ConfigDict(_train_cfg()), model.weight_decay_mask)
    mesh = make_mesh((2, 2, 1))
    abstract = jax.eval_shape(lambda r: ts.init_train_state(model, opt, r), jax.random.PRNGKey(0))
    state_sh = setup.state_shardings(abstract, mesh, model)
    step = setup.jit_train_step(model, opt, grad_accum, mesh, state_sh)
    return model, opt, abstract, step, mesh


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_fsdp_train_step_gathers_weights_once_outside_the_scan(grad_accum):
    """Weights all-gathered and gradients reduce-scattered once per train step, never inside a
    loop body: not in the scan (T = 16 steps), nor - with grad_accum - per micro-batch."""
    *_, abstract, step, mesh = _fsdp_train_step(grad_accum)
    with jax.set_mesh(mesh):
        lowered = step.lower(abstract, jax.ShapeDtypeStruct((16, 16), jnp.int32))
        text = lowered.compile(PRODUCTION_HLO).as_text()
    comps = hlo.computations(text)
    everywhere = hlo.collectives(comps, comps)[0]  # every computation
    assert everywhere["all-gather"] > 0 and everywhere["reduce-scatter"] > 0  # fsdp is real
    loops = hlo.while_loops(text)
    assert len(_recurrent_loops(text, 16)) == 2  # forward and backward scan (nested with accum)
    assert any(lp.trip_count == 16 // 4 for lp in loops)  # the chunked loss
    if grad_accum > 1:
        assert any(lp.trip_count == grad_accum for lp in loops)  # the micro-batch loop
    for lp in loops:  # no weight or gradient traffic in any loop body
        assert not lp.collectives, (lp.body, lp.trip_count, lp.op_names)


def test_sharded_gradient_accumulation_equals_one_device_full_batch():
    """2 micro-batches on (data 2, fsdp 2) = one device's full batch, compared BEFORE the
    optimiser: Adam's first update is ~lr * sign(g), which turns float-order noise in a
    near-zero gradient entry into a full-size parameter change. A wrong divisor or a micro-batch
    counted twice moves the loss and every gradient by >= 1/3, far outside the bounds. (The
    fused window's micro-batches against one device:
    test_fused_window_tensor_parallel_stateful_with_resets_and_accumulation.)"""
    model, opt, abstract, step, mesh = _fsdp_train_step(grad_accum=2)
    state = ts.init_train_state(model, opt, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(3), (16, 16), 0, MODELS["gpn_m"]["vocab_size"])
    ref_loss, ref_grads = jax.jit(jax.value_and_grad(lambda p, x: model.loss(p, x)[0]))(
        *jax.device_put((state.params, tokens), jax.devices()[0])
    )
    sharded = spmd.DataParallel(model, mesh, grad_accum=2)
    params = jax.device_put(state.params, setup.state_shardings(abstract, mesh, model).params)
    with jax.set_mesh(mesh):
        loss, grads = jax.jit(lambda p, x: sharded.value_and_grad(p, x)[:2])(
            params, jax.device_put(tokens, meshlib.batch_sharding(mesh))
        )
        _, metrics = step(state, tokens)  # the train step's own loss and gradient norm
    # 16 x 16 tokens; the gradient norm adds a sum of squares over every parameter entry
    bound = sharded_bound(tokens=16 * 16, steps=16)
    n_params = sum(np.size(g) for g in jax.tree.leaves(ref_grads))
    ref_norm = float(optax.global_norm(ref_grads))
    for value, want, rel in (
        (loss, ref_loss, bound),
        (metrics["loss"], ref_loss, bound),
        (metrics["grad_norm"], ref_norm, bound + f32_bound(n_params, 1)),
    ):
        assert float(value) == pytest.approx(float(want), rel=rel)
    assert_rel_close(grads, ref_grads, bound, "sharded accumulated gradients")
    with pytest.raises(ValueError, match="does not split into 2 micro-batch"):
        step(state, tokens[:4])  # 4 rows: not 2 micro-batches x 4 devices


def test_data_parallel_scan_has_no_collectives():
    text = _sharded_hlo("gpn_m", MESHES[0])
    for lp in hlo.while_loops(text):
        assert not lp.collectives, (lp.body, lp.trip_count, lp.op_names)


@pytest.mark.parametrize("name", ["gpn_m", "gpn_m_2l"])
def test_tensor_parallel_scan_reduces_once_per_layer_step(name):
    """(2, 2, 2): d_ffn and memory heads split over tensor, Megatron style. Each recurrent loop
    (forward and backward scan) holds exactly one all-reduce per layer - the layer's partial
    sums (SwiGLU down projection, memory read, the read norm's sum of squares) reduced
    together - and no other collective: no all-gather / reduce-scatter of weights, no
    resharding (collective-permute / all-to-all) between gate and up halves."""
    _assert_matches(name, (2, 2, 2))
    text = _sharded_hlo(name, (2, 2, 2))
    n_layers = MODELS[name]["n_layers"]
    loops = _recurrent_loops(text, T)
    assert len(loops) == 2  # forward and backward scan
    for lp in loops:
        assert dict(lp.collectives) == {"all-reduce": n_layers}, (lp.trip_count, lp.op_names)


def _own_collectives(text: str) -> list[tuple[hlo.Loop, dict, bool]]:
    """Every while loop with the collectives of its body *less those of the loops nested in it*,
    and whether loops are nested in it. `hlo.while_loops` counts a loop body with all it
    calls, so an outer loop also counts its inner loops' collectives."""
    comps = hlo.computations(text)
    loops = hlo.while_loops(text)
    out = []
    for lp in loops:
        inside = hlo.reachable(comps, lp.body)
        inner = [o for o in loops if o is not lp and o.body in inside]
        nested = set().union(*(hlo.reachable(comps, o.body) for o in inner))
        out.append((lp, dict(hlo.collectives(comps, inside - nested)[0]), bool(inner)))
    return out


@pytest.mark.parametrize("name", list(FUSED_TP))
def test_fused_window_tensor_parallel_reduces_once_per_layer_step(name):
    """The fused window's per-token loops under tensor parallelism hold exactly one all-reduce
    per predict layer and no other collective, forward and backward, as the autodiff scan's.

    Its loops (`core.fused.window`): an outer loop over segments of S steps (S = T = 8 here
    without remat, so XLA removes that one-trip loop; S = remat_segment = 4 with it), with
    per-token loops of S trips inside: the forward; in the backward the reverse step loop,
    before it either the segment's forward rerun (remat) or, with memory, the memory
    recompute, which is elementwise per head and holds nothing. The per-token loops are the
    loops of S trips with no loop inside; the loops with loops inside (the segments) must hold
    nothing themselves. The remaining loop runs the fused cross-entropy over T / loss_chunk
    chunks and reduces over the vocabulary split over tensor: once per chunk, not per token.
    """
    config, shape = MODELS[name], FUSED_TP[name]
    text = _sharded_hlo(name, shape)
    segment = config.get("remat_segment") or T
    n_layers, remat, memory = (
        config["n_layers"],
        "remat_segment" in config,
        config.get("memory", True),
    )
    loops = _own_collectives(text)
    token = [own for lp, own, nested in loops if lp.trip_count == segment and not nested]
    per_layer = {"all-reduce": n_layers}
    assert token.count(per_layer) == 2 + remat, (name, token)  # forward, backward (+ rerun)
    assert token.count({}) == (memory and not remat), (name, token)  # the memory recompute
    assert len(token) == 2 + remat + (memory and not remat), (name, token)
    for lp, own, nested in loops:
        if nested:
            assert not own, (lp.body, lp.trip_count, lp.op_names)
