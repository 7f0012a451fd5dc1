"""One gpn-prepare per `--output` (issue 83): a second one started while the first holds the
output's lock (`io.lock`, the trainer's workdir lock) is refused in one line and writes nothing
there; a refused folder of the user's is left without a lock file."""

import json
import os

import pytest

from gpn_jax.data.prepare.manifest import MANIFEST, MARKER
from gpn_jax.data.prepare.run import Options, prepare_corpus
from gpn_jax.io import lock
from gpn_jax.io.errors import CheckpointError


def _options(tmp_path, out) -> Options:
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(8)))
    return Options(input=str(inp), output=str(out), workers=1, vocab_size=256)


def test_a_second_prepare_into_a_held_output_is_refused_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    first = lock.acquire(str(out), "gpn-prepare", "--output")  # a first gpn-prepare, running
    try:
        with pytest.raises(CheckpointError, match=f"--output={out} is in use by another gpn-prep"):
            prepare_corpus(_options(tmp_path, out))
    finally:
        first.release()
    assert sorted(os.listdir(out)) == [lock.LOCK_FILE]  # no marker, manifest, shard or tokenizer


def test_a_refused_user_folder_keeps_no_lock_file(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds files that gpn-prepare did not write"):
        prepare_corpus(_options(tmp_path, out))
    assert sorted(os.listdir(out)) == ["notes.txt"]
    assert not (out / MARKER).exists() and not (out / MANIFEST).exists()
