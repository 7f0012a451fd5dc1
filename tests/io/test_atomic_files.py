"""`io.files`: atomic writes (private ones too) and the temporary path a tool writes."""

import hashlib
import os
import stat

import pytest

from gpn_jax.io import files


def test_a_private_write_is_owner_only_whatever_the_umask(tmp_path):
    path = tmp_path / "cache.json"
    old = os.umask(0o002)  # a group-writable default
    try:
        files.atomic_write(str(path), b"{}\n", private=True)
        files.atomic_write(str(tmp_path / "shared.json"), b"{}\n")
    finally:
        os.umask(old)
    assert path.read_bytes() == b"{}\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "shared.json").stat().st_mode) == 0o664
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.json", "shared.json"]


def test_atomic_output_replaces_on_success_and_leaves_the_old_file_on_failure(tmp_path):
    path = tmp_path / "lib.so"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="the tool failed"):
        with files.atomic_output(path, suffix=".so.tmp") as tmp:
            assert tmp.endswith(".so.tmp") and os.path.dirname(tmp) == str(tmp_path)
            with open(tmp, "wb") as f:
                f.write(b"half")
            raise RuntimeError("the tool failed")
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["lib.so"]
    with files.atomic_output(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(b"new")
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == ["lib.so"]


def test_sha256_file_is_the_digest_of_the_bytes(tmp_path):
    path = tmp_path / "blob"
    data = os.urandom(3 * (1 << 20) + 7)  # several read blocks and a partial one
    path.write_bytes(data)
    assert files.sha256_file(path) == hashlib.sha256(data).hexdigest()
