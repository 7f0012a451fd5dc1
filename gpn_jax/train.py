"""Trains a model: `python -m gpn_jax.train --config=experiments/configs/demo.py --workdir=/tmp/demo`.

Thin absl launcher: parses flags and calls `gpn_jax.training.loop.train_and_evaluate`, the same
function Colab calls. `--config.train.steps=100`-style overrides and `config.py:cpu` variants work.
Rerunning the same command on the same workdir resumes from its newest checkpoint.
"""

import sys

from absl import flags
from ml_collections import config_flags

from gpn_jax.configs import blocks
from gpn_jax.io import cli
from gpn_jax.training import validate

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "ml_collections config file (path.py[:cpu]), or a config the package ships by name "
    "(demo, gpn_m_1l_130m, gpn_1l_130m, gpn_m_2l_130m, transformer_130m, gdn_130m).",
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, tokenizer.")
flags.mark_flags_as_required(["config", "workdir"])
# Multi-host start-up (`gpn_jax.parallel.distributed`; GPN_* environment variables otherwise).
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "Multi-host: host:port of process 0's coordinator service."
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "Multi-host: this process's index.")
_AUTO = flags.DEFINE_bool(
    "distributed", False, "Multi-host: jax.distributed.initialize() with cluster auto-detection."
)
_TIMEOUT = flags.DEFINE_integer(
    "distributed_timeout", None, "Multi-host: seconds to wait for every process to join."
)


def _body():
    config = blocks.complete(cli.config_or_exit(_CONFIG, "gpn-train"))
    validate.check_static(config)  # before JAX loads; the loop adds `validate.check_mesh`
    # Imported only now: JAX and the training stack (flax, orbax, grain) take seconds to load,
    # and a bad config above is reported without them.
    from gpn_jax.parallel import distributed
    from gpn_jax.training import host_memory
    from gpn_jax.training.loop import train_and_evaluate

    cli.settle_heap()  # the imported stack out of the garbage collector's passes
    if config.train.reuse_step_memory:
        host_memory.inline_cpu_steps()  # before JAX starts its CPU client

    distributed.initialize(
        coordinator_address=_COORDINATOR.value,
        num_processes=_NUM_PROCESSES.value,
        process_id=_PROCESS_ID.value,
        distributed=_AUTO.value,
        distributed_timeout=_TIMEOUT.value,
    )
    result = train_and_evaluate(config, _WORKDIR.value)
    if result.get("signal") == "SIGINT":  # Ctrl-C: saved, but the command did not finish
        sys.exit(cli.INTERRUPTED)


main, run = cli.absl_entry(_body, "gpn-train", config_help=blocks.fields_help)


if __name__ == "__main__":
    run()
