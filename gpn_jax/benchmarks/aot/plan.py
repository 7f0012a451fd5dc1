"""What `python -m gpn_jax.aot` does with its flags: picks the devices and the memory to hold
the step against (`targets`), runs one compile, the batch search or the listed batches
(`search`), prints the result as text or JSON and writes it, with its provenance, to a
results file.
"""

import datetime
import json
import os
import platform
import sys

from gpn_jax.benchmarks.aot import search, targets
from gpn_jax.io.files import atomic_write
from gpn_jax.io.provenance import installed_version


def provenance(argv: list[str]) -> dict:
    """What every results file records: the command, date, machine, package versions."""

    return {
        "command": " ".join(["python -m gpn_jax.aot", *argv[1:]]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs",
        "gpn_jax_version": installed_version("gpn_jax"),
        "jax_version": installed_version("jax"),
        "libtpu_version": installed_version("libtpu"),
    }


def write_json(path: str, obj: dict) -> None:
    """Writes `obj` to `path` atomically (`io.files.atomic_write`: an existing symlink at
    `path` is replaced, never followed)."""
    atomic_write(path, (json.dumps(obj, indent=1) + "\n").encode())


def run(config, flags: dict, argv: list[str] = sys.argv) -> dict:
    """Compiles per `flags` (topology / devices, mesh, memory_gb, find_max_batch, max_trials,
    batches, json, out); prints the report or JSON; returns the result object."""
    if flags["topology"]:
        devices = targets.topology_devices(flags["topology"])
    else:
        import jax

        targets.force_cpu_devices(flags["devices"])
        devices = jax.devices()
        if len(devices) < flags["devices"]:
            raise ValueError(f"{flags['devices']} devices asked for, JAX has {len(devices)}")
        devices = devices[: flags["devices"]]
    sizes = targets.parse_mesh(flags["mesh"], config.mesh)
    memory = (
        int(flags["memory_gb"] * targets.GiB)
        if flags["memory_gb"]
        else targets.hbm_bytes(devices[0])
    )
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if flags["json"] else print
    head = {**provenance(argv), "topology": flags["topology"] or None}
    save = (lambda r: write_json(flags["out"], {**head, **r})) if flags["out"] else None
    if flags["find_max_batch"]:
        if not memory:
            raise ValueError("--find_max_batch needs the device memory: pass --memory_gb")
        result = search.find_max_batch(
            config, devices, sizes, memory, flags["max_trials"], log, save
        )
    elif flags.get("batches"):
        result = search.compile_batches(config, devices, sizes, memory, flags["batches"], log, save)
    else:
        result, text = search.compile_one(config, devices, sizes, memory)
        log(text)
    result = {**head, **result}
    if flags["json"]:
        print(json.dumps(result, indent=1), flush=True)
    else:
        log(_summary_line(result))
    if flags["out"]:
        write_json(flags["out"], result)
    return result


def _summary_line(r: dict) -> str:
    hlo, low = r.get("memory_bytes_per_token_hlo"), r.get("memory_bytes_per_token_min")
    traffic = (
        f"memory traffic {hlo / 1e6:.2f} MB/token (HLO) vs {low / 1e6:.2f} minimum "
        f"({hlo / low:.2f}x)"
        if hlo is not None and low
        else "no memory traffic figure (no GPN+M memory, or the compile did not fit)"
    )
    return f"kernels {r['kernels']}; fits: {r['fits']}; {traffic}; M in VMEM: {r['m_in_vmem']}"
