"""Multi-host: two processes on localhost (CPU, jax.distributed with a coordinator on
127.0.0.1) train as one process does, stop together and resume; distributed settings; the
launch scripts parse."""

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tests import REPO_ROOT as ROOT
from tests.environment import xla_flags
from tests.tolerance import f32_bound

LAUNCH = os.path.join(ROOT, "launch")
TIMEOUT_S = 240  # per process; every wait below is bounded


_PICKED: set[int] = set()


def free_port() -> int:
    """A free TCP port for a coordinator, never the same twice in one session and outside the
    kernel's ephemeral range: a port the kernel hands out for bind(0) can meanwhile become some
    other process's outgoing-connection port (other tests' gRPC clients), or be handed to the
    next test again, before the coordinator binds it."""
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(10000, min(low, 32768))
        if port in _PICKED:
            continue
        with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _PICKED.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range")


def cpu_env(devices: int, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPN_", "SLURM_", "OMPI_"))}
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=xla_flags(devices),
        PYTHONPATH=ROOT,
        **extra,
    )
    return env


def run_processes(commands_envs, timeout=TIMEOUT_S) -> list[subprocess.CompletedProcess]:
    """Starts every (argv, env) at once; waits for all (bounded); kills the rest on failure."""
    procs = [
        subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for argv, env in commands_envs
    ]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    failed = [f"process {i}: {r.stderr[-3000:]}" for i, r in enumerate(results) if r.returncode]
    assert not failed, "\n".join(failed)
    return results


# ----------------------------------------------------------------------------- the main job
def latest_params(workdir):
    """Parameters of the workdir's newest checkpoint, read onto one device."""
    import jax

    from experiments.configs import gpn_m_tiny
    from gpn_jax.checkpoints.manager import Checkpointer
    from gpn_jax.models import factory
    from gpn_jax.training import train_step as ts
    from gpn_jax.training.optimizer import make_optimizer

    config = gpn_m_tiny.get_config()
    model = factory.build_model(config.model)
    opt = make_optimizer(config.train, model.weight_decay_mask)
    abstract = jax.eval_shape(lambda r: ts.init_train_state(model, opt, r), jax.random.PRNGKey(0))
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one), abstract)
    with Checkpointer(workdir, async_save=False, read_only=True) as ckpt:
        step, state = ckpt.restore(target)[:2]
    return step, jax.device_get(state[1])


def wait_for_logged_step(procs, metrics_path, step, timeout=TIMEOUT_S) -> None:
    """Blocks until process 0 has logged `step` (so every host has trained it: steps are
    collective); fails if a process exits first or the wait runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), "a process exited before the signal"
        if os.path.exists(metrics_path):
            rows = [json.loads(x) for x in open(metrics_path).read().splitlines() if x.strip()]
            if any(r.get("step", 0) >= step and "loss" in r for r in rows):
                return
        time.sleep(0.05)
    raise AssertionError(f"step {step} never logged in {metrics_path}")


@pytest.mark.slow
def test_sigterm_to_one_host_stops_every_host_at_one_step_and_resumes_exactly(tmp_path):
    """`python -m gpn_jax.train` (tiny GPN+M) as two processes x 2 CPU devices against one
    process x 4 devices, with preemption reaching only process 1: both processes stop after
    the same step, save it once (collectively) and exit 0; only process 0 writes metrics;
    rerunning both resumes to the same final parameters and losses as the uninterrupted run."""
    steps = 40
    single, multi = str(tmp_path / "single"), str(tmp_path / "multi")
    flags = [
        "--config=experiments/configs/gpn_m_tiny.py",
        f"--config.train.steps={steps}",
        f"--config.train.checkpoint_every={steps}",
        "--config.train.eval_every=0",
        "--config.train.final_eval_batches=1",
        "--config.train.log_every=1",
    ]
    train = [sys.executable, "-m", "gpn_jax.train", *flags]
    run_processes([([*train, f"--workdir={single}"], cpu_env(4))])  # uninterrupted

    def hosts():
        port = free_port()
        argv = [
            *train,
            f"--workdir={multi}",
            f"--config.data.tokenizer_path={os.path.join(single, 'tokenizer.model')}",
            f"--coordinator_address=127.0.0.1:{port}",
            "--num_processes=2",
            "--distributed_timeout=60",
        ]
        return [([*argv, f"--process_id={i}"], cpu_env(2)) for i in range(2)]

    logs = [(tmp_path / f"out{i}.txt", tmp_path / f"err{i}.txt") for i in range(2)]
    files = [(open(o, "w"), open(r, "w")) for o, r in logs]  # noqa: SIM115 - closed below
    procs = [
        subprocess.Popen(a, cwd=ROOT, env=e, stdout=o, stderr=r)
        for (a, e), (o, r) in zip(hosts(), files, strict=True)
    ]  # files, not pipes: an undrained pipe could block one host and so both
    try:
        wait_for_logged_step(procs, os.path.join(multi, "metrics.jsonl"), 3)
        procs[1].send_signal(signal.SIGTERM)  # process 1 only
        for p in procs:
            p.wait(timeout=TIMEOUT_S)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in sum(files, ()):
            f.close()
    outs = [(o.read_text(), r.read_text()) for o, r in logs]
    for i, (p, (_, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, f"process {i}: {err[-3000:]}"
    saved = [re.search(r"SIGTERM: saved step (\d+)", out) for out, _ in outs]
    assert all(saved), [out[-500:] for out, _ in outs]
    stop = int(saved[0].group(1))
    assert int(saved[1].group(1)) == stop and 3 <= stop < steps
    assert sorted(os.listdir(os.path.join(multi, "checkpoints"))) == [str(stop)]  # one save
    assert not os.path.exists(os.path.join(multi, "final_metrics.json"))

    run_processes(hosts())  # resume both hosts to the end
    rows = {}
    for workdir in (single, multi):
        lines = open(os.path.join(workdir, "metrics.jsonl")).read().splitlines()
        rows[workdir] = [json.loads(x) for x in lines if '"loss"' in x]
    assert [r["step"] for r in rows[multi]] == list(range(1, steps + 1))  # none lost or repeated
    # 2 x 2 devices vs 1 x 4: the same partitioned program on a 4-device mesh, only the
    # all-reduces' 4 partials summed in another order across processes. A step's relative error
    # is 4 x eps (x4 for the loss and the optimizer's chain) and the steps' errors add up: at
    # most `steps` of them after the last step
    per_step = f32_bound(4, 4)
    before = lambda workdir: [r["loss"] for r in rows[workdir][:stop]]
    np.testing.assert_allclose(before(multi), before(single), rtol=stop * per_step)
    np.testing.assert_allclose(
        [r["loss"] for r in rows[multi]], [r["loss"] for r in rows[single]], rtol=steps * per_step
    )
    (s1, p1), (s2, p2) = latest_params(single), latest_params(multi)
    assert s1 == s2 == steps
    import jax

    for x, y in zip(jax.tree.leaves(p1), jax.tree.leaves(p2), strict=True):
        # relative to each tensor's largest entry: entries of a tensor share its scale
        assert np.max(np.abs(x - y)) <= steps * per_step * np.max(np.abs(x)), np.abs(x - y).max()


# ----------------------------------------------------------------------------- settings
def test_distributed_settings_from_env():
    from gpn_jax.parallel import distributed

    env = {"GPN_COORDINATOR": "127.0.0.1:1234", "GPN_NUM_PROCESSES": "2", "GPN_PROCESS_ID": "1"}
    assert distributed.explicit_settings(env) == {
        "coordinator_address": "127.0.0.1:1234",
        "num_processes": 2,
        "process_id": 1,
    }
    assert distributed.explicit_settings({}) is None
    # The launcher's flag values (passed in by gpn_jax.train) win over the environment.
    given = {"coordinator_address": "10.0.0.1:9", "num_processes": 4, "process_id": 3}
    assert distributed.explicit_settings(env, given) == given
    with pytest.raises(ValueError, match="needs --num_processes"):
        distributed.explicit_settings({"GPN_COORDINATOR": "127.0.0.1:1"})
    with pytest.raises(ValueError, match="outside 0..1"):
        distributed.explicit_settings(dict(env, GPN_PROCESS_ID="2"))
    assert distributed.detected_cluster({"SLURM_NTASKS": "4"})
    assert not distributed.detected_cluster({"SLURM_NTASKS": "1"})
    assert distributed.detected_cluster({"TPU_WORKER_HOSTNAMES": "10.0.0.2,10.0.0.3"})
    assert not distributed.detected_cluster({"TPU_WORKER_HOSTNAMES": "localhost"})
    assert not distributed.detected_cluster({})


# ----------------------------------------------------------------------------- launch scripts
SCRIPTS = ["tpu_vm.sh", "gpu_single_node.sh", "slurm_multinode.sbatch"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_launch_script_parses_and_is_documented(script):
    path = os.path.join(LAUNCH, script)
    subprocess.run(["bash", "-n", path], check=True, timeout=30)
    text = open(path).read()
    assert "gpn_jax.train" in text  # the one entry point, no separate code path
    assert script in open(os.path.join(LAUNCH, "README.md")).read()
