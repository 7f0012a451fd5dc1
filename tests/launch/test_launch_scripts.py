"""The launch scripts with the stand-ins (launch/standins/) and a scripted trainer in place of
`python -m gpn_jax.train`: detached jobs that outlive their session, the resume loop, stop,
attach, --dry_run, the Slurm path and the TPU supervisor. The real trainer runs under the same
scripts in the rehearsal (tests/launch/test_paper_run.py)."""

import json
import os
import signal
import subprocess
import textwrap
import time

import pytest

from tests import REPO_ROOT as ROOT

LAUNCH = os.path.join(ROOT, "launch")
STANDINS = os.path.join(LAUNCH, "standins")
WAIT_S = 60

# Each call of `python -m gpn_jax.train` takes the next action of $FAKE_DIR/plan (per host tag):
# preempt (the trainer's SIGTERM line, exit 0), fail (exit 1), error (a one-line user error),
# finish (process 0 writes final_metrics.json once every task has reached this call, as after a
# collective last step), hang (runs until SIGTERM, then saves). Anything else (`python -c ...`)
# runs the real Python.
FAKE_TRAINER = textwrap.dedent(
    """\
    #!/usr/bin/env bash
    if [[ "${1:-} ${2:-}" != "-m gpn_jax.train" ]]; then exec python3 "$@"; fi
    FAKE_DIR=@FAKE_DIR@  # stand-in hosts pass no caller environment
    shift 2
    tag="${SLURM_PROCID:-${TPU_WORKER_ID:-0}}"
    echo "$*" >> "$FAKE_DIR/argv.$tag"
    n=$(( $(cat "$FAKE_DIR/count.$tag" 2>/dev/null || echo 0) + 1 ))
    echo $n > "$FAKE_DIR/count.$tag"
    action=$(sed -n "${n}p" "$FAKE_DIR/plan")
    workdir=""
    for a in "$@"; do case "$a" in --workdir=*) workdir="${a#--workdir=}" ;; esac; done
    case "$action" in
      preempt) echo "SIGTERM: saved step $n in $workdir/checkpoints; rerun the command to resume" ;;
      fail) echo "Traceback: a crash" >&2; exit 1 ;;
      error) echo "gpn-train: error: unknown config field" >&2; exit 1 ;;
      finish)  # the last step is collective: process 0 writes once every task has reached it
        if [[ "$tag" == 0 ]]; then
          for ((t = 1; t < ${SLURM_NTASKS:-1}; t++)); do
            until (( $(cat "$FAKE_DIR/count.$t" 2>/dev/null || echo 0) >= n )); do sleep 0.05; done
          done
          echo '{"step": 9}' > "$workdir/final_metrics.json"
        fi
        echo "trained" ;;
      hang) trap 'echo "SIGTERM: saved step 5 in $workdir"; exit 0' TERM
            echo "training"; while :; do sleep 0.1; done ;;
      *) echo "no action $n" >&2; exit 3 ;;
    esac
    """
)


@pytest.fixture
def fake(tmp_path):
    """(env, fake dir, plan writer): the scripted trainer as GPN_PYTHON and as every stand-in
    host's Python, the stand-ins first on PATH."""
    d = tmp_path / "fake"
    d.mkdir()
    trainer = d / "python"
    trainer.write_text(FAKE_TRAINER.replace("@FAKE_DIR@", str(d)))
    trainer.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPN_", "SLURM_", "TPU_"))}
    env.update(
        PATH=STANDINS + os.pathsep + env["PATH"],
        GPN_PYTHON=str(trainer),
        GPN_STANDIN_PYTHON=str(trainer),
        GPN_STANDIN_ROOT=str(tmp_path / "standin"),
        GPN_RESTART_DELAY="0",
        GPN_FINAL_GRACE="5",
        GPN_ALLOW_DIRTY="1",  # this checkout may have edits (tested apart)
    )

    def plan(*actions):
        (d / "plan").write_text("\n".join(actions) + "\n")

    return env, d, plan


def sh(args, env, timeout=WAIT_S, **kw):
    return subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, **kw
    )


def job(env, *args):
    return sh(["bash", os.path.join(LAUNCH, "job.sh"), *args], env)


def test_loop_resumes_after_preemption_and_a_crash_until_final_metrics(fake, tmp_path):
    env, d, plan = fake
    plan("preempt", "fail", "finish")
    workdir = tmp_path / "run"
    r = job(env, "loop", f"--workdir={workdir}", "--config=c.py")
    assert r.returncode == 0, r.stderr
    log = (workdir / "job" / "0.log").read_text() if (workdir / "job" / "0.log").exists() else ""
    log = log or next((workdir / "job").glob("*.log")).read_text()
    assert "resuming" in log and "exited with status 1 (1 failure(s) in a row)" in log
    assert "done:" in log and (workdir / "final_metrics.json").exists()
    calls = (d / "argv.0").read_text().splitlines()
    assert calls == [f"--workdir={workdir} --config=c.py"] * 3  # the same command each time


def test_loop_stops_at_once_on_a_user_error_and_after_repeated_failures(fake, tmp_path):
    env, d, plan = fake
    plan("error", "finish")
    r = job(env, "loop", f"--workdir={tmp_path / 'a'}")
    assert r.returncode == 1 and (d / "count.0").read_text().strip() == "1"
    plan("fail", "fail", "finish")
    (d / "count.0").unlink()
    r = job(dict(env, GPN_MAX_FAILURES="2"), "loop", f"--workdir={tmp_path / 'b'}")
    assert r.returncode == 1 and (d / "count.0").read_text().strip() == "2"
    assert "gave up after 2 failures in a row" in r.stdout


def wait_for(predicate, what):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_started_job_outlives_its_session_and_stops_with_a_checkpoint(fake, tmp_path):
    env, d, plan = fake
    plan("hang", "finish")
    workdir = tmp_path / "run"
    # `start` in a session of its own, as an ssh session's shell; then the session hangs up
    # It starts with SIGHUP's default action: under nohup it would inherit SIGHUP ignored,
    # which a shell cannot undo, and sleep out its 30 s. (Set here, not in a preexec_fn, which
    # would make Popen fork this multithreaded process.)
    hup = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        session = subprocess.Popen(
            ["bash", "-c", f"launch/job.sh start --workdir={workdir}; sleep 30"],
            cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
    finally:
        signal.signal(signal.SIGHUP, hup)
    wait_for(lambda: (d / "count.0").exists(), "the trainer to start")
    os.killpg(session.pid, signal.SIGHUP)
    session.wait(timeout=WAIT_S)
    time.sleep(0.5)
    assert job(env, "status", f"--workdir={workdir}").stdout.startswith("running")
    r = job(env, "stop", f"--workdir={workdir}")
    assert "SIGTERM sent to the trainer" in r.stdout, r.stdout + r.stderr
    r = job(env, "attach", f"--workdir={workdir}")  # follows until the loop has ended
    assert "SIGTERM: saved step 5" in r.stdout and "stopped; 'start' again resumes" in r.stdout
    assert job(env, "status", f"--workdir={workdir}").stdout.startswith("not running")
    assert not (workdir / "final_metrics.json").exists()
    assert job(env, "start", f"--workdir={workdir}").returncode == 0  # resumes: plan says finish
    wait_for(lambda: (workdir / "final_metrics.json").exists(), "the resumed run to finish")
    job(env, "attach", f"--workdir={workdir}")
    assert job(env, "status", f"--workdir={workdir}").stdout.startswith("finished")


def test_dry_run_prints_every_command_and_runs_none(fake, tmp_path):
    env, _, _ = fake
    tpu = ["bash", os.path.join(LAUNCH, "tpu_vm.sh"), "--dry_run"]
    w = "--workdir=gs://b/runs/x"
    outs = {
        "create": sh([*tpu, "create", "--spot", "--queued"], env),
        "install": sh([*tpu, "install"], env),
        "train": sh([*tpu, "train", "--config=c.py", w, "--config.train.steps=5"], env),
        "attach": sh([*tpu, "attach", w], env),
        "stop": sh([*tpu, "stop", w], env),
        "delete": sh([*tpu, "delete"], env),
        "gpu": sh(["bash", "launch/gpu_single_node.sh", "--dry_run", "start", w], env),
        "gpu_install": sh(["bash", "launch/gpu_single_node.sh", "--dry_run", "install"], env),
        "slurm": sh(
            ["bash", "launch/slurm_multinode.sbatch", "--dry_run", "--config=c.py", w],
            dict(env, SLURM_NNODES="2", SLURM_JOB_ID="7"),
        ),  # fmt: skip
    }
    for name, r in outs.items():
        assert r.returncode == 0 and r.stdout.startswith("+ "), (name, r.stdout, r.stderr)
    assert "queued-resources create gpn-tpu --node-id=gpn-tpu" in outs["create"].stdout
    assert "--spot" in outs["create"].stdout
    assert "launch/setup_host.sh tpu" in outs["install"].stdout
    train = outs["train"].stdout
    assert (
        "tpu-vm ssh gpn-tpu --worker=all" in train and "launch/job.sh start --distributed" in train
    )
    assert "--config.train.steps=5" in train
    assert "setsid nohup" in outs["gpu"].stdout
    assert "launch/setup_host.sh gpu" in outs["gpu_install"].stdout
    slurm = outs["slurm"].stdout
    assert "srun --ntasks=2" in slurm and "--coordinator_address=127.0.0.1:20007" in slurm
    assert not os.path.exists(os.path.join(env["GPN_STANDIN_ROOT"], "calls.log"))  # nothing ran


def test_tpu_train_refuses_the_gcsfuse_mount_as_workdir(fake):
    env, _, _ = fake
    r = sh(["bash", "launch/tpu_vm.sh", "--dry_run", "train", "--workdir=/mnt/gcs/runs/x"], env)
    assert r.returncode == 2 and "gcsfuse mount" in r.stderr


def test_slurm_job_runs_a_resume_loop_per_node_joined_by_one_coordinator(fake, tmp_path):
    env, d, plan = fake
    plan("preempt", "finish")
    workdir = tmp_path / "run"
    env = dict(env, COORDINATOR_PORT="23456", VENV=str(tmp_path / "venv"))
    r = sh(["sbatch", "--nodes=2", "launch/slurm_multinode.sbatch", "--config=c.py",
            f"--workdir={workdir}"], env)  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip() == "Submitted batch job 1", r.stderr
    wait_for(lambda: (workdir / "final_metrics.json").exists(), "the Slurm job to finish")
    job(env, "attach", f"--workdir={workdir}")
    for task in (0, 1):
        calls = (d / f"argv.{task}").read_text().splitlines()
        assert len(calls) == 2  # preempted once, resumed once
        assert calls[0].endswith(
            "--coordinator_address=127.0.0.1:23456 --num_processes=2 "
            f"--process_id={task} --distributed_timeout=600"
        )
    wait_for(lambda: "done:" in (workdir / "job" / "1.log").read_text(), "task 1's loop to end")


def test_tpu_watch_recreates_a_preempted_slice_and_restarts_until_finished(fake, tmp_path):
    env, d, plan = fake
    plan("finish")
    env = dict(env, TPU_NAME="spot", WATCH_EVERY="0.2")
    workdir = tmp_path / "run"
    assert sh(["launch/tpu_vm.sh", "create", "--spot"], env).returncode == 0
    state = tmp_path / "standin" / "tpus" / "spot" / "state.json"
    s = json.loads(state.read_text())
    state.write_text(json.dumps(s | {"state": "PREEMPTED"}))  # the slice was taken
    r = sh(["launch/tpu_vm.sh", "watch", "--spot", "--config=c.py", f"--workdir={workdir}"], env,
           timeout=3 * WAIT_S)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[watch] spot: PREEMPTED" in r.stdout and (workdir / "final_metrics.json").exists()
    calls = (tmp_path / "standin" / "calls.log").read_text()
    assert "tpu-vm delete spot" in calls and calls.count("tpu-vm create spot") == 2
    assert "launch/setup_host.sh tpu" in calls and "launch/job.sh start --distributed" in calls
    for worker in (0, 1):
        pip = (tmp_path / "standin" / "tpus" / "spot" / f"worker{worker}" / "pip.log").read_text()
        assert "install -q -e .[tpu]" in pip


def test_tpu_install_refuses_a_checkout_with_uncommitted_edits(fake, tmp_path):
    """Issue 84: `install` ships `git archive HEAD`, so an edited config silently stayed behind
    on the paid slice. A copy of the script in a repository of its own: refused (one line,
    status 2) while a tracked file has edits, shipped once they are committed."""
    env, _, _ = fake
    env = {k: v for k, v in env.items() if k != "GPN_ALLOW_DIRTY"}
    repo = tmp_path / "repo"
    (repo / "launch").mkdir(parents=True)
    script = repo / "launch" / "tpu_vm.sh"
    script.write_text(open(os.path.join(LAUNCH, "tpu_vm.sh")).read())
    config = repo / "config.py"
    config.write_text("steps = 1\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
    config.write_text("steps = 2\n")  # edited, not committed
    install = ["bash", str(script), "--dry_run", "install"]
    r = sh(install, env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "uncommitted changes to tracked files" in r.stderr and "GPN_ALLOW_DIRTY=1" in r.stderr
    assert "git archive" not in r.stdout
    assert sh(install, dict(env, GPN_ALLOW_DIRTY="1")).returncode == 0
    subprocess.run([*git, "commit", "-q", "-am", "edit"], check=True)
    r = sh(install, env)
    assert r.returncode == 0 and "archive --format=tar.gz" in r.stdout, r.stderr
