"""Which JAX platforms a process starts: libtpu stays unloaded on a host with no TPU attached.

`pip install -e ".[dev]"` brings libtpu (the TPU compile checks need it). With JAX_PLATFORMS
unset, JAX then tries a TPU backend on every host, and on a CPU or GPU machine libtpu prints its
failure to find a TPU ("could not determine TPU accelerator type", "unexpected worker hostname",
a source-location trace) before the program's first line. `keep_libtpu_quiet` runs when
`gpn_jax` is imported, before JAX is: where libtpu is installed, no TPU is attached and the user
has not chosen platforms, it names the platforms that can start (the GPU's, where its JAX plugin
and driver are present, then the CPU). A TPU VM, a user's own JAX_PLATFORMS and a machine
without libtpu are left as they are. Compiling for a TPU topology (`gpn_jax.aot --topology`)
loads libtpu on its own, compile-only, and is unaffected.
"""

import importlib.util
import os
import pathlib
import pkgutil
import sys
from collections.abc import MutableMapping

GOOGLE_PCI_VENDOR = "0x1ae0"  # every Cloud TPU chip is a PCI device of Google's vendor id
# Variables a TPU VM (or a user preparing one) sets: their presence means "leave JAX to choose".
TPU_HOST_VARIABLES = (
    "TPU_ACCELERATOR_TYPE",
    "TPU_NAME",
    "TPU_WORKER_HOSTNAMES",
    "JAX_FORCE_TPU_INIT",
)
# A GPU platform, the prefix of its JAX plugin package, and the device file its driver creates.
GPU_PLATFORMS = (("cuda", "jax_cuda", "/dev/nvidiactl"), ("rocm", "jax_rocm", "/dev/kfd"))


def tpu_attached(pci_devices: str = "/sys/bus/pci/devices") -> bool:
    """Whether a PCI device of Google's vendor id (a TPU chip) is on this host."""
    root = pathlib.Path(pci_devices)
    try:
        vendors = [p / "vendor" for p in root.iterdir()]
    except OSError:
        return False
    for vendor in vendors:
        try:
            if vendor.read_text(errors="replace").strip().lower() == GOOGLE_PCI_VENDOR:
                return True
        except OSError:
            continue
    return False


def gpu_platforms() -> list[str]:
    """The GPU platforms whose JAX plugin is installed and whose driver's device file exists."""
    modules = [m.name for m in pkgutil.iter_modules()]
    return [
        name
        for name, plugin, device in GPU_PLATFORMS
        if any(m.startswith(plugin) for m in modules) and os.path.exists(device)
    ]


def keep_libtpu_quiet(
    environ: MutableMapping[str, str] = os.environ, pci_devices: str = "/sys/bus/pci/devices"
) -> str | None:
    """Sets JAX_PLATFORMS to this host's platforms when libtpu would only fail to find a TPU.

    Returns the value set, or None when nothing was changed (the user chose platforms, a TPU
    is attached, or libtpu is not installed).
    """
    if "JAX_PLATFORMS" in environ or any(v in environ for v in TPU_HOST_VARIABLES):
        return None
    if importlib.util.find_spec("libtpu") is None or tpu_attached(pci_devices):
        return None
    platforms = ",".join([*gpu_platforms(), "cpu"])
    environ["JAX_PLATFORMS"] = platforms
    if "jax" in sys.modules and environ is os.environ:
        # JAX read JAX_PLATFORMS when it was imported: tell its config too (no effect once a
        # backend has started, which is then too late to matter).
        sys.modules["jax"].config.update("jax_platforms", platforms)
    return platforms
