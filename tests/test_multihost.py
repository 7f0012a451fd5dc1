"""Multi-host: two processes on localhost (CPU, jax.distributed with a coordinator on
127.0.0.1) agree with one process; distributed settings; the launch scripts parse.

Run as a module (`python -m tests.test_multihost --worker ...`) this file is also the worker
of the quick two-process check.
"""

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(ROOT, "launch")
TIMEOUT_S = 240  # per process; every wait below is bounded


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_env(devices: int, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPN_", "SLURM_", "OMPI_"))}
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
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


# ----------------------------------------------------------------------------- the quick check
SHAPE = (2, 2, 2)  # data, fsdp, tensor over 8 devices: 4 per process
MODEL = dict(
    family="gpn", vocab_size=64, d_model=16, d_emb=8, d_ffn=32, n_heads=2, d_key=4, d_value=8,
    n_layers=1, loss_chunk=4,
)  # fmt: skip


def two_steps() -> dict:
    """Two sharded train steps of a tiny GPN+M on the global 8-device mesh. Each process feeds
    only its own rows of each batch (as the data pipeline does)."""
    import jax
    import ml_collections

    from gpn_jax.models import factory
    from gpn_jax.parallel import mesh as meshlib
    from gpn_jax.parallel import spmd
    from gpn_jax.training import train_step as ts
    from gpn_jax.training.optimizer import make_optimizer

    model = factory.build_model(MODEL)
    train = dict(
        grad_clip=1.0, learning_rate=1e-2, warmup_steps=0, steps=10, min_lr_ratio=0.1,
        b1=0.9, b2=0.95, weight_decay=0.1,
    )  # fmt: skip
    opt = make_optimizer(ml_collections.ConfigDict(train), model.weight_decay_mask)
    mesh = meshlib.make_mesh(ml_collections.ConfigDict(dict(zip(meshlib.AXES, SHAPE, strict=True))))
    init = lambda r: ts.init_train_state(model, opt, r)
    abstract = jax.eval_shape(init, jax.random.PRNGKey(0))
    state_sh = spmd.state_shardings(abstract, mesh, model)
    step = spmd.jit_train_step(model, opt, 1, mesh, state_sh)
    rows, n, i = 8, jax.process_count(), jax.process_index()
    losses, grad_norms = [], []
    with jax.set_mesh(mesh):
        state = jax.jit(init, out_shardings=state_sh)(jax.random.PRNGKey(0))
        for k in range(2):
            batch = np.random.RandomState(k).randint(0, 64, (rows, 8)).astype(np.int32)
            local = batch[i * rows // n : (i + 1) * rows // n]
            state, metrics = step(state, meshlib.put_batch(local, mesh))
            losses.append(float(metrics["loss"]))  # step 2's loss sees step 1's update
            grad_norms.append(float(metrics["grad_norm"]))
        return {"losses": losses, "grad_norms": grad_norms, "processes": n}


def _worker(argv) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    from gpn_jax.parallel import distributed

    distributed.initialize()  # from GPN_COORDINATOR / GPN_NUM_PROCESSES / GPN_PROCESS_ID
    result = two_steps()
    import jax

    if jax.process_index() == 0:
        with open(args.out, "w") as f:
            json.dump(result, f)


def test_two_processes_agree_with_one(tmp_path):
    port = free_port()
    out = str(tmp_path / "result.json")
    cmd = [sys.executable, "-m", "tests.test_multihost", "--worker", f"--out={out}"]
    run_processes(
        [
            (
                cmd,
                cpu_env(
                    4,
                    GPN_COORDINATOR=f"127.0.0.1:{port}",
                    GPN_NUM_PROCESSES="2",
                    GPN_PROCESS_ID=str(i),
                    GPN_DISTRIBUTED_TIMEOUT="60",
                ),
            )
            for i in range(2)
        ]
    )
    multi = json.load(open(out))
    single = two_steps()  # this process: 8 local devices, the same global mesh
    assert multi["processes"] == 2 and single["processes"] == 1
    np.testing.assert_allclose(multi["losses"], single["losses"], rtol=1e-6)
    np.testing.assert_allclose(multi["grad_norms"], single["grad_norms"], rtol=1e-6)


# ----------------------------------------------------------------------------- the main job
@pytest.mark.slow
def test_train_and_evaluate_on_two_processes_matches_one(tmp_path):
    """`python -m gpn_jax.train` (tiny GPN+M) as two processes x 2 CPU devices, and as one
    process x 4 devices: same losses and final parameters; only process 0 writes metrics;
    one checkpoint, written collectively."""
    single, multi = str(tmp_path / "single"), str(tmp_path / "multi")
    flags = [
        "--config=experiments/configs/gpn_m_tiny.py",
        "--config.train.steps=3",
        "--config.train.checkpoint_every=3",
        "--config.train.eval_every=0",
        "--config.train.final_eval_batches=1",
        "--config.train.log_every=1",
    ]
    train = [sys.executable, "-m", "gpn_jax.train", *flags]
    run_processes([([*train, f"--workdir={single}"], cpu_env(4))])
    port = free_port()
    distributed = [
        f"--workdir={multi}",
        f"--config.data.tokenizer_path={os.path.join(single, 'tokenizer.model')}",
        f"--coordinator_address=127.0.0.1:{port}",
        "--num_processes=2",
        "--distributed_timeout=60",
    ]
    run_processes([([*train, *distributed, f"--process_id={i}"], cpu_env(2)) for i in range(2)])

    def rows(workdir):
        lines = open(os.path.join(workdir, "metrics.jsonl")).read().splitlines()
        return [json.loads(line) for line in lines if '"loss"' in line]

    a, b = rows(single), rows(multi)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3]  # written once
    np.testing.assert_allclose([r["loss"] for r in b], [r["loss"] for r in a], rtol=1e-6)
    assert sorted(os.listdir(os.path.join(multi, "checkpoints"))) == ["3"]

    import jax

    from experiments.configs import gpn_m_tiny
    from gpn_jax.models import factory
    from gpn_jax.training import train_step as ts
    from gpn_jax.training.checkpointing import Checkpointer
    from gpn_jax.training.optimizer import make_optimizer

    config = gpn_m_tiny.get_config()
    model = factory.build_model(config.model)
    opt = make_optimizer(config.train, model.weight_decay_mask)
    abstract = jax.eval_shape(lambda r: ts.init_train_state(model, opt, r), jax.random.PRNGKey(0))
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one), abstract)
    params = []
    for workdir in (single, multi):  # written on 4 devices of 1 and 2 processes: read on one
        with Checkpointer(workdir, async_save=False, cleanup_tmp=False) as ckpt:
            params.append(jax.device_get(ckpt.restore(target)[1][1]))
    for x, y in zip(jax.tree.leaves(params[0]), jax.tree.leaves(params[1]), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


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


if __name__ == "__main__":
    _worker(sys.argv[1:])
