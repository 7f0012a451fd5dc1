"""Leaf checksums: the numpy path (arrays in this CPU process) and the device path (compiled,
for arrays on accelerators or other hosts) give the same record, so a step saved on one kind of
machine verifies on the other; any one changed word changes it, whatever the sharding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gpn_jax.checkpoints import checksums


def _mixed_tree():
    rng = np.random.RandomState(0)
    mesh = jax.make_mesh((8,), ("x",))
    sharded = jax.device_put(rng.randn(16, 3).astype(np.float32), NamedSharding(mesh, P("x")))
    return {
        "f32": jnp.asarray(rng.randn(4, 6), jnp.float32),
        "bf16": jnp.asarray(rng.randn(5, 3), jnp.bfloat16),
        "i32": jnp.asarray(rng.randint(-(2**31), 2**31 - 1, (7,)), jnp.int32),
        "u8": jnp.asarray(rng.randint(0, 256, (3, 3)), jnp.uint8),
        "bool": jnp.asarray(rng.rand(9) > 0.5),
        "scalar": jnp.float32(3.5),
        "empty": jnp.zeros((0, 4), jnp.float32),
        "key": jax.random.key(7),
        "sharded": sharded,
        "host": rng.randn(2, 2).astype(np.float32),  # a numpy leaf, as restored metadata is
    }


def _device_record(tree) -> dict:
    """The record as the compiled device path computes it, for every leaf."""
    leaves = checksums._array_leaves(tree)
    hashes = jax.device_get(checksums._tree_hashes([x for _, x in leaves]))
    return {
        p: "".join(f"{int(v):08x}" for v in h) for (p, _), h in zip(leaves, hashes, strict=True)
    }


def test_the_numpy_and_the_compiled_path_give_the_same_record():
    tree = _mixed_tree()
    record = checksums.leaf_record(tree)
    assert all(checksums._in_host_memory(x) for _, x in checksums._array_leaves(tree))
    assert {p: r["hash"] for p, r in record.items()} == _device_record(tree)
    assert record["['key']"]["dtype"] == "key" and record["['bf16']"]["dtype"] == "bfloat16"


def test_large_leaves_are_hashed_compiled_and_small_ones_in_numpy():
    big = jnp.arange(checksums._HOST_WORDS + 1, dtype=jnp.float32)
    small = big[: checksums._HOST_WORDS]
    assert not checksums._in_host_memory(big) and checksums._in_host_memory(small)
    record = checksums.leaf_record({"big": big, "small": small})
    assert {p: r["hash"] for p, r in record.items()} == _device_record({"big": big, "small": small})


def test_the_record_does_not_depend_on_the_sharding():
    tree = _mixed_tree()
    one = jax.device_put(tree["sharded"], jax.devices()[0])
    assert checksums.leaf_record({"a": one}) == checksums.leaf_record({"a": tree["sharded"]})


@pytest.mark.parametrize("name", ["f32", "bf16", "i32", "u8", "bool", "sharded"])
def test_one_changed_word_changes_the_hash_on_both_paths(name):
    tree = _mixed_tree()
    x = np.asarray(tree[name])
    flipped = x.copy().reshape(-1)
    flipped[-1] = ~flipped[-1] if x.dtype == np.bool_ else flipped[-1] + np.ones((), x.dtype)
    changed = {name: jnp.asarray(flipped.reshape(x.shape))}
    before, after = checksums.leaf_record({name: tree[name]}), checksums.leaf_record(changed)
    assert before[f"['{name}']"]["hash"] != after[f"['{name}']"]["hash"]
    assert _device_record({name: tree[name]}) != _device_record(changed)


def test_64_bit_leaves_hash_alike_on_both_paths():
    """With x64 on, a 64-bit word is two uint32 words, low half first, on both paths."""
    with jax.enable_x64(True):
        tree = {
            "f64": jnp.asarray(np.random.RandomState(1).randn(5), jnp.float64),
            "i64": jnp.asarray(np.arange(-3, 4) * 2**40, jnp.int64),
        }
        assert {p: r["hash"] for p, r in checksums.leaf_record(tree).items()} == _device_record(
            tree
        )
