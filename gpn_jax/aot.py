"""Ahead-of-time check: compile a config's train step for a mesh and print its memory.

    python -m gpn_jax.aot --config=experiments/configs/gpn_m_1l_130m.py --devices=8 \\
        --mesh=data=2,fsdp=4,tensor=1
    python -m gpn_jax.aot --config=experiments/configs/gpn_m_1l_130m.py --topology=v5e:2x2 \\
        --json [--find_max_batch] [--out=experiments/results/aot_130m.json]

Nothing touches an accelerator. `--devices=N` forces N CPU host devices; `--topology=NAME`
(v5e:2x2, v5p:2x2x1, v6e:1x1, ...) compiles for that TPU slice with libtpu's compile-only
devices (needs libtpu: `pip install 'jax[tpu]'`); `--topology=h100` (h200, h100:8: N GPUs of
one host) compiles for sm_90 with the CUDA plugin's compile-only devices (Python 3.12:
`pip install -e ".[gpu]"`; `gpn_jax/benchmarks/aot/gpus.py`). The train step is built by the
same code as training (`gpn_jax.training.setup.build`, the config's sharding rules), lowered
from abstract inputs and compiled. It prints XLA's per-device memory analysis of the compiled step
and whether it fits the device's memory (a TPU chip's HBM by its kind, a GPU's share that the
JAX client allocates, 0.75 of it unless XLA_PYTHON_CLIENT_MEM_FRACTION says, or `--memory_gb`),
the memory's HBM bytes per token read off the compiled HLO against their analytic minimum
(`gpn_jax/benchmarks/traffic.py`), and whether a recurrent loop body holds a collective.
`--json` prints one object (fits, peak_bytes_per_device, kernels,
memory_bytes_per_token_hlo, memory_bytes_per_token_min, the whole step's bytes over every
array `bytes_per_token_hlo`, the per-token loops' operations and bytes by kind
`per_token_loop_kinds`, ...). `--find_max_batch` compiles
per-device batches until the largest that fits is found within 8; `--batches=32,64,128`
compiles those per-device batches, one trial each. `--mesh` takes
`data,fsdp,tensor` sizes (`2,4,1`) or `axis=size` pairs; without it the config's `mesh` block
is used. `--config.train.*` flags override the batch shape as in training.

The CPU numbers come from the XLA CPU compiler: fusion, layouts and rematerialisation differ
on TPU/GPU, so read them as an estimate of an accelerator's footprint.
"""

from absl import flags
from ml_collections import config_flags

from gpn_jax.io import cli

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "ml_collections config file (path.py[:cpu]).",
    allow_override=True,  # tests import several entry points into one process
)
_DEVICES = flags.DEFINE_integer(
    "devices", 8, "Number of CPU devices of the target mesh (without --topology).",
    allow_override=True,
)  # fmt: skip
_TOPOLOGY = flags.DEFINE_string(
    "topology", None, "TPU topology or GPU to compile for: v5e:2x2, v5p:2x2x1, v6e:1x1, h100, "
    "h200, h100:8.",
    allow_override=True,
)  # fmt: skip
_MESH = flags.DEFINE_string(
    "mesh",
    None,
    "Mesh sizes: 'data,fsdp,tensor' (e.g. 2,4,1) or 'fsdp=4,tensor=2' (rest: data).",
    allow_override=True,
)
_MEMORY_GB = flags.DEFINE_float(
    "memory_gb",
    None,
    "Memory per device (GiB) to compare with (default: a TPU chip's HBM).",
    allow_override=True,
)
_JSON = flags.DEFINE_bool("json", False, "Print one JSON object.", allow_override=True)
_OUT = flags.DEFINE_string("out", None, "Also write the JSON object here.", allow_override=True)
_FIND = flags.DEFINE_bool(
    "find_max_batch", False, "Search the largest per-device batch that fits.",
    allow_override=True,
)  # fmt: skip
_BATCHES = flags.DEFINE_list(
    "batches", [], "Per-device batches to compile, one trial each (e.g. 32,64,128).",
    allow_override=True,
)  # fmt: skip
_TRIALS = flags.DEFINE_integer(
    "max_trials", 6, "Compiles at most, with --find_max_batch.", allow_override=True
)
flags.mark_flags_as_required(["config"])


def _body():
    from gpn_jax.benchmarks.aot import plan

    cli.settle_heap()  # the imported stack out of the garbage collector's passes
    return plan.run(
        _CONFIG.value,
        dict(
            devices=_DEVICES.value,
            topology=_TOPOLOGY.value,
            mesh=_MESH.value,
            memory_gb=_MEMORY_GB.value,
            json=_JSON.value,
            out=_OUT.value,
            find_max_batch=_FIND.value,
            batches=[int(b) for b in _BATCHES.value],
            max_trials=_TRIALS.value,
        ),
    )


main, run = cli.absl_entry(_body, "gpn-aot", quiet=False)


if __name__ == "__main__":
    run()
