"""`model.kernels`: one seam (`gpn_jax.kernels.resolve`) picks the fused window's kernels per
platform; explicit choices a machine cannot run are one-line errors naming `model.kernels=xla`;
GPN_JAX_NATIVE no longer decides; the choice is validated with the config and recorded."""

import logging
import sys
import types

import pytest

from gpn_jax import kernels
from gpn_jax.core.kernel_ops import CHOICES, MemoryKernels
from gpn_jax.kernels.cpu import memory, small_matmul
from gpn_jax.models import factory
from gpn_jax.models.gpn import GPNConfig
from tests.helpers.window import BASE, require_kernels


@pytest.fixture(autouse=True)
def fresh():
    """Every resolution (and the environment warning) forgotten before and after the test."""
    kernels._resolve.cache_clear()
    kernels._warn_ignored_env.cache_clear()
    yield
    kernels._resolve.cache_clear()
    kernels._warn_ignored_env.cache_clear()


def _fake_pallas(monkeypatch, module):
    """`gpn_jax.kernels.pallas` as `module` (None: not importable)."""
    monkeypatch.setitem(sys.modules, "gpn_jax.kernels.pallas", module)
    if module is None:
        monkeypatch.delattr(kernels, "pallas", raising=False)
    else:
        monkeypatch.setattr(kernels, "pallas", module, raising=False)


FAKE = MemoryKernels("pallas", print, print, None, ("float32", "bfloat16"))


def test_an_unknown_choice_lists_the_choices():
    with pytest.raises(
        ValueError, match=r"^model.kernels must be one of auto, xla, native, pallas"
    ):
        kernels.resolve("cuda", "cpu")
    with pytest.raises(ValueError, match=r"model.kernels must be one of"):
        GPNConfig(**BASE, kernels="fast")
    assert CHOICES == ("auto", "xla", "native", "pallas")


@pytest.mark.parametrize("platform", ["cpu", "gpu", "tpu"])
def test_xla_is_the_reference_backend_everywhere(platform):
    from gpn_jax.kernels import xla

    got = kernels.resolve("xla", platform)
    assert got.name == "xla" and got.grad is xla.grad and kernels.name(got) == "xla"
    assert kernels.name(None) == "xla"


def test_auto_keeps_xla_on_tpu_and_on_cpus_the_kernels_were_not_measured_on(monkeypatch):
    assert kernels.resolve("auto", "tpu").name == "xla"
    monkeypatch.setattr(kernels, "_cpu_measured_faster", lambda: False)
    assert kernels.resolve("auto", "cpu").name == "xla"


def test_auto_picks_the_cpp_kernels_on_a_cpu_they_were_measured_faster_on(monkeypatch):
    require_kernels("native")
    monkeypatch.setattr(kernels, "_cpu_measured_faster", lambda: True)
    got = kernels.resolve("auto", "cpu")
    assert got is not None and got.name == "native" and kernels.name(got) == "native"
    assert got.memory_dtypes == ("float32",) and got.matmul is not None
    assert kernels.resolve("auto", "cpu") is got  # resolved once


def test_native_off_a_cpu_is_a_one_line_error():
    with pytest.raises(kernels.KernelsUnavailable) as e:
        kernels.resolve("native", "gpu")
    msg = str(e.value)
    assert "\n" not in msg and msg.endswith("use --config.model.kernels=xla")
    assert "run on a CPU, not gpu" in msg


def test_without_a_compiler_native_is_an_error_and_auto_falls_back(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    monkeypatch.setenv("GPN_JAX_NATIVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(small_matmul, "_loaded_tile", [])
    monkeypatch.setattr(memory, "_registered", set())
    monkeypatch.setattr(kernels, "_cpu_measured_faster", lambda: True)
    with pytest.raises(kernels.KernelsUnavailable) as e:
        kernels.resolve("native", "cpu")
    msg = str(e.value)
    assert "\n" not in msg and "no C++ compiler" in msg and msg.endswith("kernels=xla")
    with caplog.at_level(logging.WARNING):
        assert kernels.resolve("auto", "cpu").name == "xla"
        assert kernels.resolve("auto", "cpu").name == "xla"
    warned = [r for r in caplog.records if "native kernels unavailable" in r.getMessage()]
    assert len(warned) == 1 and "no C++ compiler" in warned[0].getMessage()


def test_pallas_is_imported_lazily_and_an_import_failure_falls_back_once(monkeypatch, caplog):
    _fake_pallas(monkeypatch, None)
    with caplog.at_level(logging.WARNING):
        assert kernels.resolve("auto", "gpu").name == "xla"
        assert kernels.resolve("auto", "gpu").name == "xla"
    assert len([r for r in caplog.records if "pallas kernels unavailable" in r.getMessage()]) == 1
    with pytest.raises(kernels.KernelsUnavailable, match=r"^model.kernels=pallas: .*kernels=xla$"):
        kernels.resolve("pallas", "gpu")


def test_pallas_is_built_for_the_platform_and_handed_over_as_its_memory_kernels(monkeypatch):
    calls = []
    built = MemoryKernels("pallas", print, len, max, ("float32",))

    def memory_kernels(platform):
        calls.append(platform)
        return built

    fake = types.SimpleNamespace(memory_kernels=memory_kernels, MEMORY_DTYPES=("float32",))
    _fake_pallas(monkeypatch, fake)
    got = kernels.resolve("auto", "gpu", "bfloat16")
    assert got is built  # every backend returns a MemoryKernels: nothing to repackage
    assert kernels.resolve("pallas", "cpu") == got
    assert calls == ["gpu", "cpu"]


def test_the_real_pallas_kernels_resolve_on_cpu_and_on_tpu():
    """On a CPU they run in Pallas's interpreter; on a TPU an explicit choice gets the Mosaic
    variant (`kernels.pallas.tpu`), while `auto` keeps XLA there (the resolve docstring)."""
    from gpn_jax.kernels.pallas import tpu

    got = kernels.resolve("pallas", "cpu", "bfloat16")
    assert got.name == "pallas" and got.memory_dtypes == ("float32", "bfloat16")
    assert isinstance(got, MemoryKernels) and got.grad is not None
    on_tpu = kernels.resolve("pallas", "tpu", "bfloat16")
    assert on_tpu.name == "pallas" and on_tpu.memory_dtypes == ("float32", "bfloat16")
    for name in ("step", "stack", "grad"):
        fn = getattr(on_tpu, name)
        assert fn.func is getattr(tpu, name) and not fn.args[0].interpret, name
    assert kernels.resolve("auto", "tpu").name == "xla"


def test_gpn_jax_native_is_ignored_with_one_warning(monkeypatch, caplog):
    monkeypatch.setenv("GPN_JAX_NATIVE", "1")
    monkeypatch.setattr(kernels, "_cpu_measured_faster", lambda: False)
    with caplog.at_level(logging.WARNING):
        assert kernels.resolve("auto", "cpu").name == "xla"
        assert kernels.resolve("xla", "cpu").name == "xla"
    warned = [r.getMessage() for r in caplog.records if "GPN_JAX_NATIVE" in r.getMessage()]
    assert len(warned) == 1 and "--config.model.kernels=" in warned[0]


def test_the_model_resolves_its_config_for_its_platform(monkeypatch):
    model = factory.build_model({"family": "gpn", **BASE, "kernels": "xla"})
    assert model.kernels().name == "xla"
    with pytest.raises(kernels.KernelsUnavailable, match="not tpu"):
        factory.build_model({"family": "gpn", **BASE, "kernels": "native"}).on_platform(
            "tpu"
        ).kernels()
    auto = factory.build_model({"family": "gpn", **BASE, "scan_impl": "autodiff"})
    assert auto.kernels() is None  # the reference scan takes no kernels


def test_the_training_setup_records_the_resolved_choice(monkeypatch):
    """`training.setup.resolved_kernels` (what run_info records): the GPN model's resolution,
    "xla" for the families without kernel choices."""
    from gpn_jax.training import setup

    gpn = factory.build_model({"family": "gpn", **BASE, "kernels": "xla"})
    assert setup.resolved_kernels(gpn) == "xla"
    monkeypatch.setattr(type(gpn), "kernels", lambda self: FAKE)
    assert setup.resolved_kernels(gpn) == "pallas"
    transformer = factory.build_model(
        {"family": "transformer", "vocab_size": 16, "d_model": 8, "n_layers": 1, "n_heads": 2,
         "d_ffn": 8, "max_seq_len": 8}
    )  # fmt: skip
    assert setup.resolved_kernels(transformer) == "xla"
