"""The private kernel cache (`gpn_jax.kernels.cpu.build_cache`, issue 45 item 6): a cached library
is loaded only if this user built it and it still has the digest recorded at build time;
anything else is rebuilt. A tiny C source stands in for the kernels (no JAX headers needed)."""

import ctypes
import hashlib
import json
import os
import shutil
import stat
import time

import pytest

from gpn_jax.kernels.cpu import build_cache

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")

SOURCE = 'extern "C" int answer() { return 42; }\n'


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.delenv("GPN_JAX_NATIVE_CACHE", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    source = tmp_path / "answer.cc"
    source.write_text(SOURCE)
    return source


def make(source):
    """(library path, build function) as `small_matmul.built` passes them."""
    library = build_cache.cache_dir() / "answer_0123.so"
    calls = []

    def build(out):
        calls.append(out)
        build_cache.compile_library(out, source, ("-shared", "-fPIC", "-O1"), ())

    return library, build, calls


def answer(library) -> int:
    return ctypes.CDLL(str(library)).answer()


def test_the_cache_is_private_under_the_users_cache_dir(env, tmp_path):
    path = build_cache.cache_dir()
    assert path == tmp_path / "xdg" / "gpn_jax" / "native"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    os.chmod(path, 0o777)  # ours but open to all: made private again before use
    build_cache.cache_dir()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700


def test_a_build_records_its_digest_and_a_second_call_reuses_it(env):
    library, build, calls = make(env)
    assert answer(build_cache.built(library, build)) == 42
    recorded = json.loads(build_cache.sidecar(library).read_text())
    assert recorded["sha256"] == hashlib.sha256(library.read_bytes()).hexdigest()
    assert stat.S_IMODE(os.stat(library).st_mode) & 0o022 == 0
    build_cache.built(library, build)
    assert len(calls) == 1


@pytest.mark.parametrize(
    "damage",
    ["planted_without_sidecar", "empty", "truncated", "byte_flipped", "group_writable",
     "symlink", "sidecar_garbage"],
)  # fmt: skip
def test_an_untrusted_entry_is_rebuilt_not_loaded(env, tmp_path, damage):
    library, build, calls = make(env)
    build_cache.built(library, build)
    good = library.read_bytes()
    data = bytearray(good)
    if damage == "planted_without_sidecar":
        build_cache.sidecar(library).unlink()
        library.write_bytes(b"\x7fELF planted")
    elif damage == "empty":
        library.write_bytes(b"")
    elif damage == "truncated":
        library.write_bytes(good[: len(good) // 2])
    elif damage == "byte_flipped":
        data[len(data) // 2] ^= 0xFF
        library.write_bytes(bytes(data))
    elif damage == "group_writable":
        os.chmod(library, 0o775)
    elif damage == "symlink":
        other = tmp_path / "elsewhere.so"
        other.write_bytes(good)
        library.unlink()
        library.symlink_to(other)
    elif damage == "sidecar_garbage":
        build_cache.sidecar(library).write_bytes(b"[[[")
    assert not build_cache.trusted(library)
    assert answer(build_cache.built(library, build)) == 42
    assert len(calls) == 2 and build_cache.trusted(library) and not library.is_symlink()


def test_an_entry_swapped_with_another_library_and_its_sidecar_is_rebuilt(env, tmp_path):
    """`memory_step_*` and `small_matmul_*` swapped with their sidecars (issue 83): each
    sidecar's digest matches the bytes beside it, but names the other library."""
    library, build, calls = make(env)
    build_cache.built(library, build)
    other = library.with_name("other_4567.so")
    other_source = tmp_path / "other.cc"
    other_source.write_text('extern "C" int answer() { return 7; }\n')
    build_cache.built(other, lambda out: build_cache.compile_library(
        out, other_source, ("-shared", "-fPIC", "-O1"), ()))  # fmt: skip
    for ext in (".so", ".json"):  # swap the two entries, sidecars included
        a, b = library.with_suffix(ext), other.with_suffix(ext)
        a.rename(tmp_path / "swap")
        b.rename(a)
        (tmp_path / "swap").rename(b)
    assert not build_cache.trusted(library)
    assert answer(build_cache.built(library, build)) == 42
    assert len(calls) == 2


def test_cxx_with_flags_is_split_like_a_shell(env, monkeypatch):
    monkeypatch.setenv("CXX", "c++ -O2 -DUNUSED='a b'")
    assert build_cache.compiler()[1:] == ["-O2", "-DUNUSED=a b"]
    library, build, _ = make(env)
    assert answer(build_cache.built(library, build)) == 42
    monkeypatch.setenv("CXX", "no-such-compiler-xyz -O2")
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler \\(no-such-compiler-xyz"):
        build_cache.compiler()


def test_the_compiler_call_has_a_timeout(env, tmp_path, monkeypatch):
    slow = tmp_path / "slow-cxx"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)
    monkeypatch.setenv("CXX", str(slow))
    monkeypatch.setenv("GPN_JAX_CXX_TIMEOUT", "0.5")
    library, build, _ = make(env)
    with pytest.raises(RuntimeError, match="timed out after 0.5 s"):
        build_cache.built(library, build)
    assert not library.exists() and not any(
        p.name.endswith(".tmp") for p in library.parent.iterdir()
    )


def test_old_entries_and_stale_temporaries_are_pruned(env):
    library, build, _ = make(env)
    build_cache.built(library, build)
    directory = library.parent
    old = directory / "answer_old.so"
    shutil.copy(library, old)
    shutil.copy(build_cache.sidecar(library), build_cache.sidecar(old))
    tmp = directory / "tmpx.so.tmp"
    tmp.write_bytes(b"half")
    orphan = directory / "gone.json"
    orphan.write_text("{}")
    long_ago = time.time() - build_cache.PRUNE_AFTER_S - 60
    for path in (old, tmp):
        os.utime(path, (long_ago, long_ago))
    removed = build_cache.prune(directory, keep=library)
    assert set(removed) == {old, tmp, orphan}
    left = sorted(p.name for p in directory.iterdir())
    assert left == [build_cache.MARKER, "answer_0123.json", "answer_0123.so"]  # marker kept


@pytest.mark.skipif(os.getuid() != 0, reason="changing a file's owner needs root")
def test_a_library_or_cache_owned_by_another_user_is_not_trusted(env, tmp_path, monkeypatch):
    library, build, calls = make(env)
    build_cache.built(library, build)
    os.chown(library, 65534, 65534)  # another user's file in place of ours
    assert not build_cache.trusted(library)
    assert answer(build_cache.built(library, build)) == 42 and len(calls) == 2
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, 65534, 65534)
    monkeypatch.setenv("GPN_JAX_NATIVE_CACHE", str(shared))
    with pytest.raises(RuntimeError, match="is not a directory of this user"):
        build_cache.cache_dir()
