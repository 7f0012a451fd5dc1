"""Fuzz: orbax checkpoint steps as `Checkpointer.restore_latest_good` reads them.

A base run of two steps is saved once; each example damages the newest step (truncations,
byte flips and wrong JSON types in its metadata, data state, config and checksum files,
byte flips in its array data files, traversal names in its file checksum record). The
restore must then give step 2 unchanged (the damage touched no byte that matters), or
step 1 bit for bit (step 2 detected as damage), or one `CheckpointError` line; nothing
else is raised and Python opens nothing outside the run directory. (tensorstore's own C++
reads are not visible to the audit hook; allocations are not measured here: array sizes
come from orbax's metadata, whose every file the file checksum record covers.)
"""

import glob
import hashlib
import json
import logging
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpn_jax.checkpoints.manager import Checkpointer, CheckpointError
from gpn_jax.io.lock import LOCK_FILE
from tests.helpers.fuzz import one_line, watch

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def make_state(seed: int) -> dict:
    r = np.random.default_rng(seed)
    return {
        "params": {"w": jnp.asarray(r.normal(size=(32, 32)).astype(np.float32))},
        "step": jnp.asarray(seed, jnp.int32),
    }


STATES = {1: make_state(1), 2: make_state(2)}
TARGET = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), make_state(0))
TEXT = ["config/metadata", "meta/metadata", "data/process_0-of-1.json", "checksums/metadata",
        "checksums/files.json", "state/_sharding", "state/_METADATA",
        "state/array_metadatas/process_0", "_CHECKPOINT_METADATA"]  # fmt: skip
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=5,
)  # fmt: skip
TRAVERSALS = ["../../../etc/passwd", "/etc/passwd", "../1/state/_sharding", "state/../../x"]


def _digests(root: str) -> dict:
    return {
        os.path.relpath(os.path.join(d, f), root): hashlib.sha256(
            open(os.path.join(d, f), "rb").read()
        ).hexdigest()
        for d, _, files in os.walk(root)
        for f in files
    }


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    """The two saved steps; examples get hard-linked copies, so at the end every file must
    still be as saved (nothing wrote into a linked file)."""
    workdir = str(tmp_path_factory.mktemp("base"))
    with Checkpointer(workdir, keep=5) as ck:
        for step, state in STATES.items():
            ck.save(step, state, {"pos": step}, {"model": {"d": 32}}, {"tokens_seen": step})
    saved = _digests(workdir)
    yield workdir
    assert _digests(workdir) == saved


def _link(src: str, dst: str) -> None:
    """Copies by hard link (copying the bytes costs a fair share of an example): the damage
    replaces its file (`_apply`), and restoring reads; only the run's lock file, which a
    Checkpointer writes, is copied."""
    if os.path.basename(src) == LOCK_FILE:
        shutil.copy2(src, dst)
    else:
        os.link(src, dst)


@st.composite
def damage(draw):
    """(relative path in step 2, how, argument) of one damage."""
    how = draw(st.sampled_from(["truncate", "flip", "json", "traversal", "data_flip"]))
    if how == "data_flip":
        return "", how, (draw(st.floats(0, 1)), draw(st.integers(1, 255)))
    name = draw(st.sampled_from(TEXT))
    if how == "truncate":
        return name, how, draw(st.floats(0, 1, exclude_max=True))
    if how == "flip":
        return name, how, (draw(st.floats(0, 1, exclude_max=True)), draw(st.integers(1, 255)))
    if how == "traversal":
        return "checksums/files.json", how, draw(st.sampled_from(TRAVERSALS))
    return name, how, draw(JSON)


def _apply(step_dir: str, name: str, how: str, arg) -> None:
    if how == "data_flip":
        files = sorted(glob.glob(os.path.join(step_dir, "state", "**", "d", "*"), recursive=True))
        name = os.path.relpath(max(files, key=os.path.getsize), step_dir)
        how = "flip"
    path = os.path.join(step_dir, name)
    data = bytearray(open(path, "rb").read())
    if how == "truncate":
        data = data[: int(arg * len(data))]
    elif how == "flip":
        pos = min(int(arg[0] * len(data)), len(data) - 1)
        data[pos] ^= arg[1]
    elif how == "traversal":
        record = json.loads(data)
        record["files"][arg] = "0" * 64
        data = json.dumps(record).encode()
    else:
        data = json.dumps(arg).encode()
    os.remove(path)  # a new file: the old one is a hard link into `base`
    with open(path, "wb") as f:
        f.write(bytes(data))


def _check(base: str, tmp_path, case) -> None:
    workdir = str(tmp_path / "run")
    shutil.rmtree(workdir, ignore_errors=True)
    shutil.copytree(base, workdir, copy_function=_link)
    _apply(os.path.join(workdir, "checkpoints", "2"), *case)
    logging.disable(logging.WARNING)
    try:
        with watch() as w:
            try:  # opening the directory may already find the damage
                with Checkpointer(workdir, keep=5) as ck:
                    step, state, data, config, _ = ck.restore_latest_good(TARGET)
            except CheckpointError as e:
                one_line(e, workdir)
            else:
                assert (data, config) == ({"pos": step}, {"model": {"d": 32}})
                for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(STATES[step]), strict=True):  # fmt: skip
                    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    finally:
        logging.disable(logging.NOTSET)
    assert not w.outside(workdir), w.outside(workdir)


SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@settings(max_examples=40, **SETTINGS)
@given(case=damage())
def test_fuzz_checkpoint(base, tmp_path, case):
    _check(base, tmp_path, case)


@pytest.mark.slow
@settings(max_examples=150, **SETTINGS)
@given(case=damage())
def test_fuzz_checkpoint_many(base, tmp_path, case):
    _check(base, tmp_path, case)
