"""Sampling flags out of range are one line (issue 51, case 9): `generate --temperature=nan`
exited 0 printing garbage."""

import math
import subprocess
import sys

import pytest

from gpn_jax.eval.sampling import SamplingConfig, check_generation
from gpn_jax.io import paths
from tests.environment import one_device_env

ROOT = __file__.rsplit("/tests/", 1)[0]


@pytest.mark.parametrize(
    "kw, text",
    [
        (dict(temperature=math.nan), "temperature must be a number in [0, 10000]"),
        (dict(temperature=math.inf), "temperature must be"),
        (dict(temperature=-0.5), "temperature must be"),
        (dict(temperature=1e5), "temperature must be"),
        (dict(top_p=math.nan), "top_p must be in (0, 1]"),
        (dict(top_p=0.0), "top_p must be in (0, 1]"),
        (dict(top_p=1.0000001), "top_p must be in (0, 1]"),
        (dict(top_k=-1), "top_k must be an integer in [0, 2^31)"),
        (dict(top_k=2**40), "top_k must be"),
        (dict(top_k=True), "top_k must be"),
    ],
)
def test_sampling_settings_out_of_range_are_refused(kw, text):
    with pytest.raises(ValueError) as err:
        SamplingConfig(**kw)
    assert text in str(err.value)
    SamplingConfig(temperature=0.0, top_p=1.0, top_k=0)  # the edges themselves are allowed


@pytest.mark.parametrize(
    "args, text",
    [((2**40, 0, 1), "max_new_tokens must be in"), ((8, 2**70, 1), "seed must be in [0, 4294967295]"),
     ((8, -1, 1), "seed must be in"), ((8, 0, 0), "num_samples must be in"),
     ((8, 0, 10**9), "num_samples must be in")],
)  # fmt: skip
def test_generation_lengths_seeds_and_counts_are_bounded(args, text):
    with pytest.raises(ValueError, match=text.replace("[", r"\[").replace("]", r"\]")):
        check_generation(*args)


def test_samples_times_new_tokens_is_bounded_before_any_allocation():
    """`--num_samples=65536 --max_new_tokens=16777216`, each in range (issue 83)."""
    with pytest.raises(ValueError, match=r"num_samples=65536 x --max_new_tokens=16777216 is "
                       r"1099511627776 tokens to sample, over the limit of 16777216"):  # fmt: skip
        check_generation(2**24, 0, 2**16)
    check_generation(2**24, 0, 1)  # the limit itself is allowed
    check_generation(2**8, 0, 2**16)


def test_a_local_path_is_a_url_only_if_it_starts_with_a_scheme():
    assert not paths.is_remote("/data/http://mirror/corpus")
    assert not paths.is_remote("runs/gs://x")
    assert paths.is_remote("gs://bucket/run") and paths.is_remote("s3+x://b")


@pytest.mark.parametrize(
    "flag, text",
    [("--temperature=nan", "--temperature must be a number"), ("--top_p=nan", "--top_p must be"),
     ("--seed=1180591620717411303424", "--seed must be in"),
     (("--num_samples=65536", "--max_new_tokens=1024"), "--num_samples=65536 x --max_new_tok"),
     (b"--prompt=caf\xe9", "--prompt is not UTF-8 text (byte 0xe9 at character 3)")],
)  # fmt: skip
def test_the_cli_refuses_them_in_one_line_before_loading_anything(tmp_path, flag, text):
    flags = flag if isinstance(flag, tuple) else (flag,)
    cmd = [sys.executable, "-m", "gpn_jax.generate", f"--workdir={tmp_path / 'no_run'}", *flags]
    proc = subprocess.run(cmd, cwd=ROOT, env=one_device_env(PYTHONPATH=ROOT), capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("gpn-generate: error: ") and text in lines[0], lines[0]
