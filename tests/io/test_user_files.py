"""Nothing of the user's is deleted or overwritten (issue 51, case 3): gpn-prepare writes only
into an output directory it created (or found empty) and marked; the kernel cache prunes and
chmods only a directory it marked, and lives in a marked subfolder of a user's folder."""

import json
import os
import stat
import time

import pytest

from gpn_jax.checkpoints import owned_dir
from gpn_jax.data.prepare.manifest import MARKER
from gpn_jax.data.prepare.run import Options, prepare_corpus
from gpn_jax.data.text_sources import embedded_corpus
from gpn_jax.data.tokenizer import train_tokenizer
from gpn_jax.io.files import atomic_write
from gpn_jax.kernels.cpu import build_cache

V = 512


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tok") / "tok.model")
    train_tokenizer(embedded_corpus(), V, path)
    return path


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "c.jsonl"
    docs = [f"doc {i}: " + t[:400] for i, t in enumerate(embedded_corpus()[:30])]
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return str(path)


def prepare(inp, out, tokenizer_path, **kw):
    return prepare_corpus(
        Options(input=inp, output=str(out), tokenizer_path=tokenizer_path, workers=1,
                heldout_fraction=0.1, shard_tokens=4000, progress=False, **kw)
    )  # fmt: skip


def snapshot(directory):
    return {p: p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def test_prepare_refuses_a_folder_holding_the_users_files(tmp_path, jsonl, tokenizer_path):
    """`--output=` a folder holding the user's own `tokenizer.model` overwrote it."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "tokenizer.model").write_bytes(b"the user's own tokenizer")
    (folder / "NOTES.md").write_text("notes")
    before = snapshot(folder)
    with pytest.raises(ValueError, match=f"^{folder} holds files that gpn-prepare did not write"):
        prepare(jsonl, folder, tokenizer_path)
    assert snapshot(folder) == before and sorted(os.listdir(folder)) == [
        "NOTES.md",
        "tokenizer.model",
    ]


def test_prepare_marks_its_output_and_leaves_the_users_additions(tmp_path, jsonl, tokenizer_path):
    """A new or empty output is created and marked; a file the user adds to it later survives
    a rerun, and a finished output is not rewritten."""
    empty = tmp_path / "empty"
    empty.mkdir()
    for out in (tmp_path / "new", empty):
        prepare(jsonl, out, tokenizer_path)
        assert (out / MARKER).is_file() and (out / "manifest.json").is_file()
    (empty / "NOTES.md").write_text("mine")
    before = snapshot(empty)
    prepare(jsonl, empty, tokenizer_path)
    assert snapshot(empty) == before


def test_overwrite_replaces_only_what_prepare_wrote(tmp_path, jsonl, tokenizer_path):
    out = tmp_path / "out"
    prepare(jsonl, out, tokenizer_path)
    (out / "NOTES.md").write_text("mine")
    (out / "train" / "README").write_text("mine too")
    with pytest.raises(ValueError, match="holds another corpus's shards .*--overwrite"):
        prepare(jsonl, out, tokenizer_path, seed=1)
    second = prepare(jsonl, out, tokenizer_path, seed=1, overwrite=True)
    assert second["settings"]["seed"] == 1
    assert (out / "NOTES.md").read_text() == "mine" and (
        out / "train/README"
    ).read_text() == "mine too"
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "tokenizer.model").write_bytes(b"the user's")
    with pytest.raises(ValueError, match="did not write"):  # not even with --overwrite
        prepare(jsonl, folder, tokenizer_path, overwrite=True)
    assert (folder / "tokenizer.model").read_bytes() == b"the user's"


@pytest.fixture
def users_folder(tmp_path, monkeypatch):
    """$GPN_JAX_NATIVE_CACHE pointed at a folder of the user's: .json, .tmp and .so files old
    enough to be pruned, mode 0755."""
    folder = tmp_path / "mine"
    folder.mkdir()
    old = time.time() - build_cache.PRUNE_AFTER_S - 3600
    for name in ("settings.json", "draft.tmp", "plugin.so"):
        (folder / name).write_text(name)
        os.utime(folder / name, (old, old))
    folder.chmod(0o755)
    monkeypatch.setenv("GPN_JAX_NATIVE_CACHE", str(folder))
    return folder


def test_the_kernel_cache_never_prunes_or_chmods_a_users_folder(users_folder):
    """The cache deleted the user's .json/.tmp/.so files there and chmodded the folder 0700."""
    before = snapshot(users_folder)
    cache = build_cache.cache_dir()
    assert cache == users_folder / build_cache.SUBFOLDER
    assert (cache / build_cache.MARKER).is_file()
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    build_cache.prune(cache)
    assert build_cache.cache_dir() == cache  # marked: reused
    assert stat.S_IMODE(os.stat(users_folder).st_mode) == 0o755
    after = {p: b for p, b in snapshot(users_folder).items() if cache not in p.parents}
    assert after == before


def test_an_unmarked_subfolder_of_the_users_is_refused(users_folder):
    (users_folder / build_cache.SUBFOLDER).mkdir()
    (users_folder / build_cache.SUBFOLDER / "x.so").write_text("mine too")
    with pytest.raises(RuntimeError, match="holds files this cache did not write"):
        build_cache.cache_dir()
    assert (users_folder / build_cache.SUBFOLDER / "x.so").read_text() == "mine too"


def test_an_empty_folder_is_adopted(tmp_path, monkeypatch):
    folder = tmp_path / "empty"
    folder.mkdir()
    monkeypatch.setenv("GPN_JAX_NATIVE_CACHE", str(folder))
    assert build_cache.cache_dir() == folder and (folder / build_cache.MARKER).is_file()


def _write_two(folder: str) -> None:
    atomic_write(os.path.join(folder, "config.json"), b"{}")
    atomic_write(os.path.join(folder, "README.md"), b"card")


def test_export_into_an_existing_empty_folder_keeps_the_folder_and_the_umask(tmp_path):
    """The user's empty folder (setgid, group-writable) stays that folder (issue 83): same
    inode and mode, and the files written there have the modes the user's umask gives."""
    out = tmp_path / "shared"
    out.mkdir()
    os.chmod(out, 0o2775)
    before = os.stat(out)
    old = os.umask(0o002)
    try:
        owned_dir.write_owned(str(out), _write_two, None)
    finally:
        os.umask(old)
    after = os.stat(out)
    assert (after.st_ino, stat.S_IMODE(after.st_mode)) == (before.st_ino, 0o2775)
    assert sorted(os.listdir(out)) == sorted(["config.json", "README.md", owned_dir.MARKER])
    for name in os.listdir(out):
        assert stat.S_IMODE(os.stat(out / name).st_mode) == 0o664, name


def test_export_into_a_new_folder_gives_it_the_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        owned_dir.write_owned(str(tmp_path / "new"), _write_two, None)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "new").st_mode) == 0o755
