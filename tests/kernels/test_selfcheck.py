"""The Pallas kernels' first-use self-check (`gpn_jax.kernels.selfcheck`): each pass against the
XLA formulas on the device it runs on, a failing pass keeps `auto` on XLA with one warning and
makes an explicit `pallas` a one-line error, the outcome is cached (and the cache read as
untrusted), and the checks are recorded for run_info.

Here the "device" is this CPU: the passing backend is the real Pallas kernels in Pallas's
interpreter, the failing ones are those kernels with one pass broken (a wrong result, or a pass
that does not lower)."""

import json
import logging

import jax
import jax.numpy as jnp
import pytest

from gpn_jax import kernels
from gpn_jax.kernels import pallas, selfcheck
from gpn_jax.kernels.pallas import memory_kernels

SMALL = (2, 2, 8, 16, 3)  # B, H, K, U, S: interpreted, a fraction of a second per pass


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    """A private cache, resolutions and records forgotten; the check's device is this CPU and
    its shapes small (the interpreter), whatever platform the resolution names."""
    monkeypatch.setenv("GPN_JAX_SELFCHECK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(selfcheck, "DIMS", SMALL)
    monkeypatch.setattr(selfcheck, "_RECORDS", [])
    kernels._resolve.cache_clear()
    yield
    kernels._resolve.cache_clear()


@pytest.fixture(scope="module")
def interpreted():
    return memory_kernels(interpret=True, platform="cpu")


def _broken(passes, name, how):
    """`passes` with pass `name` wrong by 1 % in its first output, or failing to lower."""
    good = getattr(passes, name)

    def wrong(*args):
        out = good(*args)
        return (out[0] * 1.01, *out[1:])

    def unlowerable(*args):
        raise NotImplementedError("Mosaic cannot lower this block shape")

    return passes._replace(**{name: wrong if how == "wrong" else unlowerable})


def _as_gpu(monkeypatch, passes):
    """`resolve(..., "gpu")` builds `passes` and checks them on this CPU."""
    monkeypatch.setattr(pallas, "memory_kernels", lambda platform: passes)
    monkeypatch.setattr(selfcheck, "device_for", lambda platform: jax.devices("cpu")[0])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_interpreted_kernels_pass_every_check(interpreted, dtype):
    results = selfcheck.compare_passes(interpreted, jax.devices("cpu")[0], dtype, SMALL)
    assert list(results) == list(selfcheck.PASSES)
    for name, r in results.items():
        assert r["ok"] and r["stage"] == "match" and r["error"] is None, (name, r)
        assert 0 <= r["rel_err"] <= r["bound"] == selfcheck.bound(name, SMALL, dtype)


def test_bounds_are_derived_from_the_shapes_and_the_storage():
    B, H, K, U, S = SMALL
    assert selfcheck.bound("step", SMALL, "float32") == 2.0**-23 * (K + U) * selfcheck.MARGIN
    assert selfcheck.bound("stack", SMALL, "bfloat16") == pytest.approx(
        2.0**-23 * S * (K + U) * selfcheck.MARGIN + S * 2.0**-7
    )


@pytest.mark.parametrize(("name", "how", "stage"), [("grad", "wrong", "match"),
                                                    ("stack", "unlowerable", "lower")])  # fmt: skip
def test_a_failing_pass_is_named_with_its_stage(interpreted, name, how, stage):
    results = selfcheck.compare_passes(
        _broken(interpreted, name, how), jax.devices("cpu")[0], "float32", SMALL
    )
    bad = selfcheck.first_failure(results)
    assert bad[0] == name and bad[1]["stage"] == stage and not bad[1]["ok"]
    assert [n for n, r in results.items() if not r["ok"]] == [name]
    if how == "wrong":
        assert bad[1]["rel_err"] > 10 * bad[1]["bound"]  # 1 % against bounds of at most 0.1 %
    else:
        assert "NotImplementedError: Mosaic cannot lower" in bad[1]["error"]


def test_auto_falls_back_to_xla_with_one_warning_and_pallas_fails_in_one_line(
    monkeypatch, interpreted, caplog
):
    _as_gpu(monkeypatch, _broken(interpreted, "grad", "wrong"))
    with caplog.at_level(logging.WARNING):
        assert kernels.resolve("auto", "gpu").name == "xla"
        assert kernels.resolve("auto", "gpu").name == "xla"  # resolved once per process
    warned = [
        r.getMessage() for r in caplog.records if "pallas kernels unavailable" in r.getMessage()
    ]
    assert len(warned) == 1 and "self-check of pass grad failed at match" in warned[0]
    with pytest.raises(kernels.KernelsUnavailable) as e:
        kernels.resolve("pallas", "gpu")
    msg = str(e.value)
    assert "\n" not in msg and "pass grad" in msg and msg.endswith("kernels=xla")
    assert [r["status"] for r in selfcheck.recorded()] == ["failed", "failed"]
    assert selfcheck.recorded()[1]["cached"]  # the explicit choice read the first outcome


def test_a_passing_check_hands_over_the_kernels_and_is_cached(monkeypatch, interpreted):
    _as_gpu(monkeypatch, interpreted)
    got = kernels.resolve("auto", "gpu", "bfloat16")
    assert got.name == "pallas" and got.step is interpreted.step
    first = selfcheck.recorded()[0]
    assert (
        first["status"] == "passed" and not first["cached"] and first["memory_dtype"] == "bfloat16"
    )
    assert set(first) >= {"device_kind", "key", "seconds"} and "passes" not in first
    cache = json.loads(selfcheck.cache_path().read_text())
    assert cache == {first["key"]: {"status": "passed", "failed_pass": None, "stage": None,
                                    "reason": None}}  # fmt: skip
    kernels._resolve.cache_clear()
    monkeypatch.setattr(selfcheck, "_run", lambda *a: pytest.fail("not read from the cache"))
    assert kernels.resolve("auto", "gpu", "bfloat16") == got
    assert selfcheck.recorded()[1]["cached"]


@pytest.mark.parametrize(
    "content",
    ['{"k": {"status": "passed"}}', "not json", '["a list"]', '{"k": {"status": "passed", '
     '"failed_pass": null, "stage": null, "reason": 3}}', "x" * (selfcheck.MAX_CACHE_BYTES + 1)],
)  # fmt: skip
def test_a_malformed_cache_is_ignored_and_rewritten(content):
    path = selfcheck.cache_path()
    path.write_text(content)
    assert selfcheck.load_cache(path) == {}
    entry = {"status": "failed", "failed_pass": "step", "stage": "run", "reason": "boom"}
    selfcheck.store(path, "key", entry | {"passes": {}, "seconds": 1.0})
    assert selfcheck.load_cache(path) == {"key": entry}


def test_no_device_of_the_platform_skips_the_check(monkeypatch, interpreted):
    """Compiling for a TPU from a CPU host: nothing to run on, the kernels are kept."""
    rec = selfcheck.ensure("tpu", interpreted)
    assert rec["status"] == "skipped" and "no tpu device" in rec["reason"]


def test_the_check_inside_a_trace_runs_eagerly(interpreted):
    """A model may resolve its kernels first while a step is being traced."""
    cpu = jax.devices("cpu")[0]

    def traced(x):
        r = selfcheck.compare_passes(interpreted, cpu, "float32", SMALL, names=("step",))
        assert r["step"]["ok"], r
        return x + 1

    assert jax.jit(traced)(jnp.zeros(())) == 1


def test_a_cached_failure_is_trusted_only_as_one_line(monkeypatch, interpreted):
    """A cached outcome is read, not rerun; its reason is untrusted text and the error stays
    one line."""
    _as_gpu(monkeypatch, interpreted)
    key = selfcheck.cache_key(jax.devices("cpu")[0], "float32")
    entry = {"status": "failed", "failed_pass": "stack", "stage": "run", "reason": "a\nb\rc"}
    selfcheck.store(selfcheck.cache_path(), key, entry)
    monkeypatch.setattr(selfcheck, "_run", lambda *a: pytest.fail("the cache was not read"))
    with pytest.raises(kernels.KernelsUnavailable) as e:
        kernels.resolve("pallas", "gpu", "float16")  # a storage the kernels lack: float32's check
    assert "\n" not in str(e.value) and "\r" not in str(e.value) and "(a b c)" in str(e.value)


def test_a_run_records_only_its_own_platforms_checks():
    """A GPU compile in this process (`gpn_jax.aot --topology=h100` resolves the Pallas kernels
    for a GPU the process does not have) leaves a skipped GPU check; a CPU run's record of its
    kernel checks does not list it."""
    assert selfcheck.ensure("gpu", None)["status"] == "skipped"
    assert [r["platform"] for r in selfcheck.recorded()] == ["gpu"]
    assert selfcheck.recorded("cpu") == []
