"""A damaged checkpoint step is detected, skipped with a warning and moved aside; never restored.

Each test saves two steps of a state large enough that its arrays live in OCDBT data files
(not inline in the b-tree), damages the newest one on disk, and resumes: the previous step
must come back bit for bit.
"""

import glob
import json
import logging
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpn_jax.checkpoints.manager import Checkpointer, CheckpointError

LOGGER = "gpn_jax.checkpoints.manager"
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def make_state(seed: int) -> dict:
    r = np.random.default_rng(seed)
    return {
        "params": {
            "w": jnp.asarray(r.normal(size=(64, 64)).astype(np.float32)),
            "e": jnp.asarray(r.normal(size=(300,)).astype(jnp.bfloat16)),
        },
        "step": jnp.asarray(seed, jnp.int32),
        "rng": jax.random.PRNGKey(seed),
    }


def _target():
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), make_state(0))


@pytest.fixture
def two_steps(tmp_path):
    """(workdir, {step: state}, newest step's directory)."""
    states = {1: make_state(1), 2: make_state(2)}
    with Checkpointer(tmp_path, keep=5) as ck:
        for step, state in states.items():
            ck.save(step, state, {"pos": step}, {"model": {"d": 64}}, {"tokens_seen": step})
    return tmp_path, states, os.path.join(str(tmp_path), "checkpoints", "2")


def _flip(path: str, pos: int | None = None) -> None:
    data = bytearray(open(path, "rb").read())
    pos = len(data) // 2 if pos is None else pos
    data[pos] ^= 0x01
    with open(path, "wb") as f:
        f.write(data)


def _data_files(step_dir: str) -> list[str]:
    return sorted(glob.glob(os.path.join(step_dir, "state", "**", "d", "*"), recursive=True))


def _resumes_from_step_1(workdir, states, step_dir, caplog) -> str:
    """Asserts a resume skips step 2 with a warning, moves it aside and restores step 1
    exactly; returns the warning."""
    with Checkpointer(workdir, keep=5) as ck, caplog.at_level(logging.WARNING, logger=LOGGER):
        step, state, data, config, meta = ck.restore_latest_good(_target(), quarantine=True)
    assert (step, data, config, meta) == (1, {"pos": 1}, {"model": {"d": 64}}, {"tokens_seen": 1})
    for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(states[1]), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert os.path.isdir(step_dir + ".unreadable-0") and not os.path.exists(step_dir)
    warned = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert warned[0].startswith("checkpoint step 2 unreadable, falling back: ")
    return warned[0]


def test_a_flipped_byte_in_the_largest_data_file_is_caught(two_steps, caplog):
    workdir, states, step_dir = two_steps
    _flip(max(_data_files(step_dir), key=os.path.getsize))
    assert "checksum mismatch" in _resumes_from_step_1(workdir, states, step_dir, caplog)


def test_a_flipped_byte_in_every_data_file_is_caught(two_steps, caplog):
    workdir, states, step_dir = two_steps
    for path in _data_files(step_dir):
        _flip(path)
    _resumes_from_step_1(workdir, states, step_dir, caplog)


def test_a_flipped_data_byte_is_caught_without_the_file_record(two_steps, caplog):
    """A save killed after orbax finalised it but before `files.json` was written: the
    leaf checksums alone still catch changed array data."""
    workdir, states, step_dir = two_steps
    os.remove(os.path.join(step_dir, "checksums", "files.json"))
    _flip(max(_data_files(step_dir), key=os.path.getsize))
    assert "array ['params']['w']" in _resumes_from_step_1(workdir, states, step_dir, caplog)


def test_a_deleted_checksums_item_is_damage_not_an_older_save(two_steps, caplog):
    """Removing a step's checksums must not switch its verification off: its orbax metadata
    still lists the item, so the step is damaged (a step saved before checksums lists none)."""
    workdir, states, step_dir = two_steps
    shutil.rmtree(os.path.join(step_dir, "checksums"))
    _flip(max(_data_files(step_dir), key=os.path.getsize))
    assert "checksums item is missing" in _resumes_from_step_1(workdir, states, step_dir, caplog)


TEXT_FILES = [
    "state/_sharding",
    "state/array_metadatas/process_0",
    "state/_METADATA",
    "state/manifest.ocdbt",
    "_CHECKPOINT_METADATA",
    "config/metadata",
    "meta/metadata",
    "data/process_0-of-1.json",
    "checksums/metadata",
]


@pytest.mark.parametrize("name", TEXT_FILES)
@pytest.mark.parametrize("how", ["flip", "non_utf8"])
def test_a_garbled_text_file_is_damage(two_steps, caplog, name, how):
    workdir, states, step_dir = two_steps
    path = os.path.join(step_dir, name)
    if how == "flip":
        _flip(path)
    else:
        _flip(path, 0)
        data = bytearray(open(path, "rb").read())
        data[len(data) // 2] = 0xFF  # never valid in UTF-8
        open(path, "wb").write(bytes(data))
    _resumes_from_step_1(workdir, states, step_dir, caplog)


@pytest.mark.parametrize(
    "name, value",
    [
        ("config/metadata", []),
        ("meta/metadata", []),
        ("data/process_0-of-1.json", {}),
        ("data/process_0-of-1.json", []),
        ("checksums/metadata", []),
    ],
)
@pytest.mark.parametrize("with_file_record", [True, False])
def test_wrong_typed_or_swapped_json_is_damage(two_steps, caplog, name, value, with_file_record):
    workdir, states, step_dir = two_steps
    if not with_file_record:  # then the item's own type check or checksum catches it
        os.remove(os.path.join(step_dir, "checksums", "files.json"))
    with open(os.path.join(step_dir, name), "w") as f:
        json.dump(value, f)
    _resumes_from_step_1(workdir, states, step_dir, caplog)


def test_restoring_a_named_damaged_step_is_one_line(two_steps):
    workdir, _, step_dir = two_steps
    os.remove(os.path.join(step_dir, "checksums", "files.json"))
    _flip(max(_data_files(step_dir), key=os.path.getsize))
    with Checkpointer(workdir, keep=5, read_only=True) as ck:
        with pytest.raises(CheckpointError, match=r"^checkpoint step 2 in .* is damaged: ") as e:
            ck.restore(_target(), step=2)
    assert "\n" not in str(e.value)


def test_the_nan_guard_names_the_newest_intact_step(two_steps):
    workdir, _, step_dir = two_steps
    with Checkpointer(workdir, keep=5) as ck:
        assert ck.newest_intact_step() == 2
        _flip(os.path.join(step_dir, "state", "_sharding"))
        assert ck.newest_intact_step() == 1


def test_an_undamaged_step_restores_with_its_checksums(two_steps):
    workdir, states, step_dir = two_steps
    record = json.load(open(os.path.join(step_dir, "checksums", "files.json")))
    assert "state/_sharding" in record["files"] and "checksums/metadata" in record["files"]
    with Checkpointer(workdir, keep=5) as ck:
        step, state, *_ = ck.restore_latest_good(_target())
    assert step == 2
    for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(states[2]), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_load_run_with_only_a_list_config_is_one_line(two_steps):
    """A checkpoint config/metadata of `[]` is not read as a config: readers fall back to an
    older step, and with none left say so in one line."""
    from gpn_jax.checkpoints.restore import load_run

    workdir, _, step_dir = two_steps
    for step in ("1", "2"):
        path = os.path.join(os.path.dirname(step_dir), step, "config", "metadata")
        open(path, "w").write("[]")
    with pytest.raises(CheckpointError, match=r"no readable config in .*not a JSON object") as e:
        load_run(str(workdir))
    assert "\n" not in str(e.value)


def test_a_list_checkpoint_metadata_is_one_line_naming_the_file(two_steps):
    """orbax reads every step's `_CHECKPOINT_METADATA` on opening the directory; one of the
    wrong JSON type is named with the fix instead of orbax's ValueError."""
    workdir, _, step_dir = two_steps
    path = os.path.join(step_dir, "_CHECKPOINT_METADATA")
    open(path, "w").write("[]")
    with pytest.raises(CheckpointError) as e:
        Checkpointer(workdir, keep=5)
    assert str(e.value).startswith(f"{path} is a JSON list, not an object: step 2 is damaged;")
    assert f"move {step_dir} aside" in str(e.value) and "\n" not in str(e.value)
