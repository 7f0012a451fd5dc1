"""Multi-host start-up: `jax.distributed.initialize()` before any backend use.

On TPU pods and SLURM/Open MPI GPU clusters JAX discovers the coordinator itself; elsewhere set
GPN_COORDINATOR (host:port), GPN_NUM_PROCESSES and GPN_PROCESS_ID. A single process does nothing.
"""

import os

import jax

_initialized = False


def initialize() -> None:
    global _initialized
    if _initialized:
        return
    coordinator = os.environ.get("GPN_COORDINATOR")
    if coordinator:
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=int(os.environ["GPN_NUM_PROCESSES"]),
            process_id=int(os.environ["GPN_PROCESS_ID"]),
        )
    elif any(
        v in os.environ for v in ("TPU_WORKER_HOSTNAMES", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")
    ):
        if int(os.environ.get("SLURM_NTASKS", os.environ.get("OMPI_COMM_WORLD_SIZE", "2"))) > 1:
            jax.distributed.initialize()
    _initialized = True
