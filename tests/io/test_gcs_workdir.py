"""`--workdir=gs://bucket/run` without a network: the object store is stood in for at its two
client seams, so everything above them - our code, etils.epath and orbax's GCS code paths (no
renames, `commit_success.txt` commits) - runs as it would against GCS:

* epath reaches `gs://` through fsspec's "gcs" protocol: registered here as a local directory
  (`LocalBucketFS`) instead of gcsfs;
* orbax hands array data to tensorstore's "gcs" kvstore driver: its spec builder
  (`gcs_utils.get_kvstore_for_gcs`) is pointed at a "file" kvstore under the same directory,
  and its bucket-metadata query (google-cloud-storage) answers "flat bucket".

What this cannot show is GCS's own behaviour (consistency, latency, auth): only a real bucket can.
"""

import importlib
import json
import os
import sys
import types

import pytest
from etils.epath import backend as epath_backend
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from orbax.checkpoint._src.path import gcs_utils

from tests.helpers.training import tiny_two_step_config as tiny_config

URL = "gs://bucket/run"
# The module's dict of protocol -> class (`fsspec.registry` itself is a read-only view of it).
FSSPEC_REGISTRY = importlib.import_module("fsspec.registry")._registry


def bucket_fs(root: str):
    class LocalBucketFS(DirFileSystem):
        """fsspec 'gcs' filesystem keeping `gs://bucket/x` in `<root>/bucket/x` on local disk;
        like gcsfs it names paths `bucket/x` in what it returns."""

        protocol = ("gs", "gcs")
        cachable = False  # a fresh root per test

        def __init__(self, *args, finalize_on_close=False, **kwargs):
            del args, finalize_on_close, kwargs  # gcsfs's options, passed by epath
            super().__init__(path=root, fs=LocalFileSystem(auto_mkdir=True))

        @classmethod
        def _strip_protocol(cls, path):
            path = os.fspath(path)
            for prefix in ("gs://", "gcs://"):
                path = path.removeprefix(prefix)
            return path.rstrip("/")

    return LocalBucketFS


@pytest.fixture
def fake_gcs(tmp_path, monkeypatch):
    root = str(tmp_path / "object_store")
    os.makedirs(root)
    fs_cls = bucket_fs(root)
    for name in ("gs", "gcs"):
        monkeypatch.setitem(FSSPEC_REGISTRY, name, fs_cls)
    epath_backend.fsspec_backend._get_filesystem.cache_clear()

    def kvstore(path):
        bucket, blob = gcs_utils.parse_gcs_path(path, add_trailing_slash=False)
        local = os.path.join(root, bucket, blob)
        # As orbax's own spec for a local path: a single key (e.g. `_sharding`) as is, an OCDBT
        # directory with the trailing slash its kvstack needs.
        if sys._getframe(1).f_code.co_name == "_build_non_ocdbt_kvstore_tspec":
            return {"driver": "file", "path": local}
        return {"driver": "file", "path": local + "/"}

    monkeypatch.setattr(gcs_utils, "get_kvstore_for_gcs", kvstore)
    # orbax asks the bucket's metadata (google-cloud-storage) whether it is hierarchical
    flat_bucket = types.SimpleNamespace(hierarchical_namespace_enabled=False)
    monkeypatch.setattr(gcs_utils, "get_bucket", lambda name: flat_bucket)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # a `gs:/...` path written as a local one would land here
    yield os.path.join(root, "bucket", "run"), str(cwd)
    epath_backend.fsspec_backend._get_filesystem.cache_clear()


def metric_steps(store):
    lines = open(os.path.join(store, "metrics.jsonl")).read().splitlines()
    return [json.loads(x)["step"] for x in lines if '"loss"' in x]


def all_files(top):
    return sorted(os.path.relpath(os.path.join(d, f), top) for d, _, fs in os.walk(top) for f in fs)


@pytest.mark.slow
def test_train_resume_and_read_a_gs_workdir(fake_gcs):
    from gpn_jax.checkpoints.restore import load_run
    from tests.helpers.training import train_on_one_device

    store, cwd = fake_gcs
    c = tiny_config()
    c.train.update(dict(log_every=1, final_eval_batches=1))
    final = train_on_one_device(c, URL)
    assert json.load(open(os.path.join(store, "final_metrics.json"))) == final
    assert metric_steps(store) == [1, 2]
    files = all_files(store)
    assert "tokenizer.model" in files and any(f.startswith("tensorboard/events.") for f in files)
    assert "checkpoints/2/commit_success.txt" in files  # orbax's GCS commit, not a rename
    assert not [f for f in files if "write_probe" in f or ".tmp" in f], files
    assert os.listdir(cwd) == []

    c.train.steps = 3  # rerun: resumes from the gs:// checkpoint of step 2
    final = train_on_one_device(c, URL)
    assert final["step"] == 3 and metric_steps(store) == [1, 2, 3]
    assert sorted(os.listdir(os.path.join(store, "checkpoints"))) == ["2", "3"]

    before = {f: os.stat(os.path.join(store, f)).st_mtime_ns for f in all_files(store)}
    run = load_run(URL)  # readers take the URL too, and only read
    assert run.step == 3 and run.tokenizer is not None
    assert {f: os.stat(os.path.join(store, f)).st_mtime_ns for f in all_files(store)} == before
    assert os.listdir(cwd) == []


def test_probe_and_temporary_names_are_unique_per_host_process_and_call(tmp_path, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    from gpn_jax.io import paths

    names = {paths.unique_suffix() for _ in range(100)}
    assert len(names) == 100 and all(n.split("-")[:2] == ["0", str(os.getpid())] for n in names)
    created = []
    real_open = open

    def recording_open(path, *args, **kwargs):
        created.append(os.path.basename(os.fspath(path)))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", recording_open)
    with ThreadPoolExecutor(8) as pool:  # "hosts" starting at once on one shared directory
        list(pool.map(lambda _: paths.probe_writable(str(tmp_path)), range(16)))
        list(pool.map(lambda i: paths.write_bytes(str(tmp_path / "f"), b"%d" % i), range(16)))
    probes = [n for n in created if n.startswith(".write_probe-")]
    tmps = [n for n in created if n.startswith("f.tmp-")]
    assert len(set(probes)) == len(probes) == 16 and len(set(tmps)) == len(tmps) == 16
    assert os.listdir(tmp_path) == ["f"]  # no probe or temporary file left behind
