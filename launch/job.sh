#!/usr/bin/env bash
# One host's training job: detached, resumed after preemption, re-attachable, stoppable.
#
#   launch/job.sh start  --workdir=W [gpn_jax.train flags...]   # detached; returns at once
#   launch/job.sh loop   --workdir=W [gpn_jax.train flags...]   # the same loop, in the foreground
#   launch/job.sh attach --workdir=W                            # follow the log until the job ends
#   launch/job.sh stop   --workdir=W                            # save a checkpoint and stop
#   launch/job.sh status --workdir=W
#   launch/job.sh --dry_run start ...                           # print the commands, run none
#
# `loop` runs `python -m gpn_jax.train FLAGS` until <workdir>/final_metrics.json exists. A trainer
# that saved on SIGTERM (a maintenance event or preemption notice reaching any host: every host
# saves the same step and exits 0) is restarted at once and resumes from the newest checkpoint;
# a trainer that fails is restarted until it has failed GPN_MAX_FAILURES times in a row (3),
# except after a one-line user error (`gpn-train: error: ...`: a bad flag, config or input).
# `start` runs `loop` in a new session (setsid, nohup, stdin closed), so it survives the ssh
# session that started it. The log, the pid files and the stop flag live in the job directory:
# <workdir>/job for a local (or shared) workdir, ~/gpn_jobs/<workdir with / as _> for gs://.
# Every host of a multi-host run runs its own loop; files carry the host's tag
# (TPU_WORKER_ID, SLURM_PROCID, else the hostname). Environment: GPN_PYTHON (python3),
# GPN_MAX_FAILURES (3), GPN_RESTART_DELAY (seconds between attempts, 10),
# GPN_FINAL_GRACE (seconds a non-lead host waits for final_metrics.json, 120).
set -uo pipefail

DRY_RUN=0
if [[ "${1:-}" == "--dry_run" ]]; then DRY_RUN=1; shift; fi
CMD="${1:-}"
shift || true
PYTHON="${GPN_PYTHON:-python3}"
TAG="${GPN_HOST_TAG:-${TPU_WORKER_ID:-${SLURM_PROCID:-$(hostname)}}}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

die() { echo "launch/job.sh: $*" >&2; exit 2; }
quote() {  # one word as a shell reads it back, single-quoted where needed
  if [[ "$1" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}
show() { printf '+'; for a in "$@"; do printf ' '; quote "$a"; done; echo; }

WORKDIR=""
for a in "$@"; do
  case "$a" in --workdir=*) WORKDIR="${a#--workdir=}" ;; esac
done
[[ -n "$WORKDIR" ]] || die "needs --workdir=<the run's workdir> (usage at the top of $0)"
if [[ "$WORKDIR" == *://* ]]; then
  JOBDIR="${GPN_JOB_DIR:-$HOME/gpn_jobs/$(printf '%s' "$WORKDIR" | tr -c 'A-Za-z0-9._-' '_')}"
else
  JOBDIR="${GPN_JOB_DIR:-${WORKDIR%/}/job}"
fi
LOG="$JOBDIR/$TAG.log"
LOOP_PID="$JOBDIR/$TAG.loop.pid"
TRAINER_PID="$JOBDIR/$TAG.trainer.pid"
STOP="$JOBDIR/stop"

say() { echo "[job $TAG] $*" | tee -a "$LOG"; }

finished() {  # final_metrics.json in the workdir (local path or gs:// through etils.epath)
  if [[ "$WORKDIR" == *://* ]]; then
    "$PYTHON" -c 'import sys; from etils import epath
sys.exit(0 if (epath.Path(sys.argv[1]) / "final_metrics.json").exists() else 1)' "$WORKDIR"
  else
    [[ -f "$WORKDIR/final_metrics.json" ]]
  fi
}

alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

run_trainer() {  # one attempt; sets RC and PREEMPTED
  local mark child
  mark=$(wc -c <"$LOG")
  "$PYTHON" -m gpn_jax.train "$@" >>"$LOG" 2>&1 </dev/null &
  child=$!
  echo "$child" >"$TRAINER_PID"
  wait "$child"
  RC=$?
  while kill -0 "$child" 2>/dev/null; do wait "$child"; RC=$?; done  # a trapped signal woke us
  rm -f "$TRAINER_PID"
  PREEMPTED=0 USER_ERROR=0
  if [[ $RC != 0 ]] && tail -c "+$((mark + 1))" "$LOG" | grep -q "^gpn-train: error:"; then
    USER_ERROR=1  # a bad flag, config or input: rerunning cannot fix it
  fi
  if [[ $RC == 0 ]] && tail -c "+$((mark + 1))" "$LOG" | grep -q "SIGTERM: saved step"; then
    PREEMPTED=1
  fi
}

loop() {
  mkdir -p "$JOBDIR"
  echo "$$ $(hostname)" >"$LOOP_PID"
  local stopping=0 failures=0 attempt=0 waited
  trap 'stopping=1' TERM INT HUP  # the trainer gets its own SIGTERM; this loop just stops looping
  while :; do
    if finished; then say "done: $WORKDIR/final_metrics.json exists"; break; fi
    if [[ -e "$STOP" || $stopping == 1 ]]; then say "stopped; 'start' again resumes"; break; fi
    attempt=$((attempt + 1))
    say "attempt $attempt: $PYTHON -m gpn_jax.train $*"
    run_trainer "$@"
    if [[ $PREEMPTED == 1 ]]; then
      failures=0
      say "the trainer saved a checkpoint on SIGTERM; resuming"
    elif [[ $RC == 0 ]]; then
      failures=0
      waited=0  # the lead host writes final_metrics.json after the last collective step
      while ! finished && ((waited < ${GPN_FINAL_GRACE:-120} * 5)); do sleep 0.2; waited=$((waited + 1)); done
      continue
    else
      failures=$((failures + 1))
      say "the trainer exited with status $RC ($failures failure(s) in a row)"
      if [[ $USER_ERROR == 1 ]] || ((failures >= ${GPN_MAX_FAILURES:-3})); then
        say "gave up after $failures failures in a row; see $LOG"
        rm -f "$LOOP_PID"
        exit "$RC"
      fi
    fi
    [[ -e "$STOP" || $stopping == 1 ]] || sleep "${GPN_RESTART_DELAY:-10}"
  done
  rm -f "$LOOP_PID"
}

start() {
  if [[ $DRY_RUN == 1 ]]; then
    show mkdir -p "$JOBDIR"
    show rm -f "$STOP"
    show setsid nohup "$HERE/job.sh" loop "$@"
    return
  fi
  mkdir -p "$JOBDIR"
  if alive "$LOOP_PID"; then die "a job is already running here (pid $(cut -d' ' -f1 "$LOOP_PID"), log $LOG)"; fi
  rm -f "$STOP"
  # A new session with no terminal: closing the ssh session that ran `start` does not reach it.
  setsid nohup "$HERE/job.sh" loop "$@" >/dev/null 2>>"$LOG" </dev/null &
  local loop_pid=$! waited=0
  # until the loop has written its pid file, or has already ended (an already finished run
  # says "done" at once and removes the file: no need to wait the full 5 s for it)
  until [[ -f "$LOOP_PID" ]] || ! kill -0 "$loop_pid" 2>/dev/null || ((waited > 50)); do
    sleep 0.1
    waited=$((waited + 1))
  done
  if [[ -f "$LOOP_PID" ]] || kill -0 "$loop_pid" 2>/dev/null; then
    echo "started: pid $(cut -d' ' -f1 "$LOOP_PID" 2>/dev/null || echo "$loop_pid"), log $LOG"
  else
    echo "started and already ended: $(tail -n 1 "$LOG" 2>/dev/null)"
  fi
}

lead_running() {  # the loop runs, on this host (pid check) or elsewhere (its log is not closed)
  if [[ -f "$LOOP_PID" && "$(cut -d' ' -f2 "$LOOP_PID")" == "$(hostname)" ]]; then
    kill -0 "$(cut -d' ' -f1 "$LOOP_PID")" 2>/dev/null
  else
    [[ -f "$LOOP_PID" ]] && ! finished
  fi
}

attach() {
  # this host's job, else (from a login node) process 0's, else the newest in the job directory
  if [[ ! -f "$LOG" ]]; then
    LOG="$JOBDIR/0.log"
    [[ -f "$LOG" ]] || LOG="$(ls -t "$JOBDIR"/*.log 2>/dev/null | head -n 1)"
    LOOP_PID="${LOG%.log}.loop.pid"
  fi
  if [[ $DRY_RUN == 1 ]]; then show tail -n +1 -F "$LOG"; return; fi
  [[ -f "$LOG" ]] || die "no job log in $JOBDIR: was the job started with this --workdir?"
  tail -s 0.2 -n +1 -F "$LOG" 2>/dev/null &
  local tail_pid=$!
  while lead_running; do sleep 0.2; done
  sleep 0.5  # tail's last look at the log (it checks every 0.2 s)
  kill "$tail_pid" 2>/dev/null
  wait "$tail_pid" 2>/dev/null
  return 0
}

stop() {
  if [[ $DRY_RUN == 1 ]]; then
    show touch "$STOP"
    show kill -TERM "<pid in $TRAINER_PID>"
    return
  fi
  mkdir -p "$JOBDIR"
  touch "$STOP"
  if alive "$TRAINER_PID"; then
    kill -TERM "$(cat "$TRAINER_PID")"  # the trainer saves a checkpoint (every host, same step)
    echo "stop: SIGTERM sent to the trainer (pid $(cat "$TRAINER_PID")); it saves, then exits"
  else
    echo "stop: no trainer running on this host; the loop will not restart one"
  fi
}

status() {
  if finished; then echo "finished: $WORKDIR/final_metrics.json"; return 0; fi
  if [[ -f "$LOOP_PID" ]] && kill -0 "$(cut -d' ' -f1 "$LOOP_PID")" 2>/dev/null; then
    echo "running: pid $(cut -d' ' -f1 "$LOOP_PID"), log $LOG"
  else
    echo "not running; log $LOG"
  fi
}

# Everything runs from main, called on the last line: bash has then read the whole file,
# so editing or updating the checkout while a job runs cannot change what runs.
main() {
  case "$CMD" in
    start) start "$@" ;;
    loop)
      if [[ $DRY_RUN == 1 ]]; then show "$PYTHON" -m gpn_jax.train "$@"; exit 0; fi
      loop "$@" ;;
    attach) attach ;;
    stop) stop ;;
    status) status ;;
    *) die "usage: $0 [--dry_run] {start|loop|attach|stop|status} --workdir=W [gpn_jax.train flags...]" ;;
  esac
}
main "$@"; exit $?
