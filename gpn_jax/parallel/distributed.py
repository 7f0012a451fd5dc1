"""Multi-host start-up: `jax.distributed.initialize()` before any backend use.

Where the processes come from, in order:

1. `gpn_jax.train`'s flags `--coordinator_address=host:port --num_processes=N --process_id=i`
   (any launcher), passed in by the entry point;
2. environment `GPN_COORDINATOR` (host:port), `GPN_NUM_PROCESSES`, `GPN_PROCESS_ID`;
3. `--distributed` (or `GPN_DISTRIBUTED=1`), or a detected cluster - a multi-host Cloud TPU
   slice (`TPU_WORKER_HOSTNAMES` lists several hosts), Slurm (`SLURM_NTASKS` > 1), Open MPI
   (`OMPI_COMM_WORLD_SIZE` > 1): `jax.distributed.initialize()` with JAX's own cluster
   detection (on Cloud TPU it reads the VM metadata; `launch/tpu_vm.sh` passes `--distributed`);
4. otherwise a single process: nothing to do.

`--distributed_timeout` / `GPN_DISTRIBUTED_TIMEOUT` (seconds, default 300) bounds how long a
process waits for the others to join. Must run before anything touches a JAX backend
(`jax.devices()`, creating an array); `gpn_jax.train` calls it in `main` right after
loading and checking the config (nothing before it imports JAX).
"""

import os

import jax

_initialized = False


def explicit_settings(environ=None, given: dict | None = None) -> dict | None:
    """{coordinator_address, num_processes, process_id} from `given` (the entry point's flag
    values, None where not given), else GPN_* env, else None."""
    environ = os.environ if environ is None else environ
    given = given or {}
    coordinator = given.get("coordinator_address") or environ.get("GPN_COORDINATOR")
    if not coordinator:
        return None
    n, i = given.get("num_processes"), given.get("process_id")
    n = int(environ["GPN_NUM_PROCESSES"]) if n is None and "GPN_NUM_PROCESSES" in environ else n
    i = int(environ["GPN_PROCESS_ID"]) if i is None and "GPN_PROCESS_ID" in environ else i
    if n is None or i is None:
        raise ValueError(
            "a coordinator address needs --num_processes and --process_id "
            "(or GPN_NUM_PROCESSES and GPN_PROCESS_ID)"
        )
    if not 0 <= i < n:
        raise ValueError(f"process_id {i} is outside 0..{n - 1}")
    return {"coordinator_address": coordinator, "num_processes": n, "process_id": i}


def detected_cluster(environ=None) -> bool:
    """True on a multi-process cluster JAX can configure itself (TPU pod slice, Slurm, MPI)."""
    environ = os.environ if environ is None else environ
    tpu_hosts = [h for h in environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    return (
        len(tpu_hosts) > 1
        or int(environ.get("SLURM_NTASKS", "1") or 1) > 1
        or int(environ.get("OMPI_COMM_WORLD_SIZE", "1") or 1) > 1
    )


def _timeout(environ, given: dict) -> int:
    t = given.get("distributed_timeout")
    return int(t if t is not None else environ.get("GPN_DISTRIBUTED_TIMEOUT", 300))


def initialize(environ=None, **given) -> None:
    """Joins the other processes of a multi-host run (see the module doc); idempotent.

    `given`: the launcher's flag values (`coordinator_address`, `num_processes`,
    `process_id`, `distributed`, `distributed_timeout`; None or absent where not given).
    The flags are defined by the entry point (`gpn_jax.train`), not here: nothing below the
    entry points reads absl flags.
    """
    global _initialized
    if _initialized:
        return
    environ = os.environ if environ is None else environ
    settings = explicit_settings(environ, given)
    if settings is not None:
        if settings["num_processes"] > 1:
            timeout = _timeout(environ, given)
            jax.distributed.initialize(**settings, initialization_timeout=timeout)
    elif (
        given.get("distributed")
        or environ.get("GPN_DISTRIBUTED") == "1"
        or detected_cluster(environ)
    ):
        jax.distributed.initialize(initialization_timeout=_timeout(environ, given))
    _initialized = True
