#!/usr/bin/env bash
# Cloud TPU VM (one host or a multi-host pod slice): create, install, train detached, follow,
# stop, supervise a spot slice, delete. docs/paper_run.md walks through it; launch/README.md
# says what each step does.
#
#   launch/tpu_vm.sh create [--spot] [--queued]      # a TPU VM, or a queued resource
#   launch/tpu_vm.sh resolve                         # here: pip resolves install's .[tpu], installs nothing
#   launch/tpu_vm.sh install                         # this checkout's HEAD + .[tpu] on every worker
#   launch/tpu_vm.sh train --config=... --workdir=gs://bucket/runs/x [gpn_jax.train flags...]
#   launch/tpu_vm.sh attach --workdir=...            # follow worker 0's log (Ctrl-C detaches)
#   launch/tpu_vm.sh status --workdir=...
#   launch/tpu_vm.sh stop --workdir=...              # every host saves one checkpoint, stops
#   launch/tpu_vm.sh watch [--spot] [--queued] --config=... --workdir=...   # recreate when preempted
#   launch/tpu_vm.sh delete [--queued]
#   launch/tpu_vm.sh --dry_run <any of the above>    # print every command, run none
#
# `train` starts launch/job.sh on every worker (`--worker=all`) in its own session, so the
# run outlives the ssh session; on each host job.sh restarts `python -m gpn_jax.train
# --distributed` after a preemption notice until final_metrics.json exists. `watch` covers
# the slice itself going away (spot / queued-resource preemption): it recreates, reinstalls
# and restarts, and the trainer resumes from the newest checkpoint in the workdir.
# Settings (environment): TPU_NAME, ZONE, ACCELERATOR_TYPE, RUNTIME_VERSION, PROJECT
# (optional), BUCKET (optional gs:// bucket: `train` defaults to --workdir=$BUCKET/runs/$TPU_NAME,
# `install` mounts it read-only with gcsfuse at /mnt/gcs for the data), WATCH_EVERY (s, 60).
# The workdir is a gs:// URL, never the gcsfuse mount: orbax commits a step on a filesystem by
# renaming its directory, and renames on gcsfuse are not atomic (`train` refuses /mnt/gcs).
set -euo pipefail

TPU_NAME="${TPU_NAME:-gpn-tpu}"
ZONE="${ZONE:-us-central2-b}"
ACCELERATOR_TYPE="${ACCELERATOR_TYPE:-v4-32}"
RUNTIME_VERSION="${RUNTIME_VERSION:-tpu-ubuntu2204-base}"
PROJECT="${PROJECT:-}"
BUCKET="${BUCKET:-}"
REMOTE_DIR="${REMOTE_DIR:-gpn_jax}"
REMOTE_VENV="${REMOTE_VENV:-gpn_venv}"  # relative to each worker's home
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

DRY_RUN=0
if [[ "${1:-}" == "--dry_run" ]]; then DRY_RUN=1; shift; fi
quote() {  # one word as a shell reads it back, single-quoted where needed
  if [[ "$1" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}
show() { printf '+'; for a in "$@"; do printf ' '; quote "$a"; done; echo; }
run() {  # every external command goes through here
  if [[ $DRY_RUN == 1 ]]; then show "$@"; else "$@"; fi
}

gcloud_tpu() {  # gcloud_tpu <group: tpu-vm | queued-resources> <verb> ...
  local group=$1
  shift
  local project_flag=()
  if [[ -n "$PROJECT" ]]; then project_flag=(--project="$PROJECT"); fi
  run gcloud compute tpus "$group" "$@" --zone="$ZONE" "${project_flag[@]}"
}

on_workers() {  # on_workers <all | N> <remote shell command>
  gcloud_tpu tpu-vm ssh "$TPU_NAME" --worker="$1" --command="$2"
}

# The remote job command: launch/job.sh of the shipped checkout, with the venv's Python.
job() { echo "cd $REMOTE_DIR && GPN_PYTHON=\$HOME/$REMOTE_VENV/bin/python launch/job.sh $*"; }

OPT_SPOT=0 OPT_QUEUED=0
take_options() {  # sets OPT_*; leaves the other arguments in ARGS
  ARGS=()
  for a in "$@"; do
    case "$a" in
      --spot) OPT_SPOT=1 ;;
      --queued) OPT_QUEUED=1 ;;
      *) ARGS+=("$a") ;;
    esac
  done
}

workdir_of() {  # the --workdir among ARGS, else $BUCKET/runs/$TPU_NAME (appended to ARGS)
  WORKDIR=""
  for a in "${ARGS[@]+"${ARGS[@]}"}"; do
    case "$a" in
      --workdir=/mnt/gcs*)
        echo "use --workdir=gs://... rather than the gcsfuse mount (renames there are not atomic)" >&2
        exit 2 ;;
      --workdir=*) WORKDIR="${a#--workdir=}" ;;
    esac
  done
  if [[ -z "$WORKDIR" && -n "$BUCKET" ]]; then
    WORKDIR="${BUCKET%/}/runs/$TPU_NAME"
    ARGS+=("--workdir=$WORKDIR")
  fi
  [[ -n "$WORKDIR" ]] || { echo "needs --workdir=gs://... (or BUCKET)" >&2; exit 2; }
}

create() {
  local spot=()
  if [[ $OPT_SPOT == 1 ]]; then spot=(--spot); fi
  if [[ $OPT_QUEUED == 1 ]]; then
    gcloud_tpu queued-resources create "$TPU_NAME" --node-id="$TPU_NAME" \
      --accelerator-type="$ACCELERATOR_TYPE" --runtime-version="$RUNTIME_VERSION" "${spot[@]}"
    # a queued resource is granted when capacity frees up: wait for ACTIVE
    until [[ $DRY_RUN == 1 ]] || [[ "$(queued_state)" == ACTIVE ]]; do sleep "${WATCH_EVERY:-60}"; done
  else
    gcloud_tpu tpu-vm create "$TPU_NAME" --accelerator-type="$ACCELERATOR_TYPE" \
      --version="$RUNTIME_VERSION" "${spot[@]}"
  fi
}

queued_state() { gcloud_tpu queued-resources describe "$TPU_NAME" --format='value(state.state)'; }
vm_state() { gcloud_tpu tpu-vm describe "$TPU_NAME" --format='value(state)' 2>/dev/null || echo GONE; }

install() {
  # Ship this checkout (committed files) to every worker; install it there with .[tpu].
  # Uncommitted edits of tracked files (a config changed in place) would silently stay behind.
  if [[ "${GPN_ALLOW_DIRTY:-0}" != 1 && -n "$(git -C "$REPO_ROOT" status --porcelain --untracked-files=no)" ]]; then
    echo "launch/tpu_vm.sh install: $REPO_ROOT has uncommitted changes to tracked files, and install ships the committed HEAD only (git archive); commit them, or set GPN_ALLOW_DIRTY=1 to ship HEAD without them" >&2
    exit 2
  fi
  local tmp archive
  tmp="$(mktemp -d)"
  archive="$tmp/gpn_jax.tar.gz"
  run git -C "$REPO_ROOT" archive --format=tar.gz -o "$archive" HEAD
  gcloud_tpu tpu-vm scp "$archive" "$TPU_NAME":gpn_jax.tar.gz --worker=all
  on_workers all "set -e; rm -rf $REMOTE_DIR; mkdir -p $REMOTE_DIR; tar -xzf gpn_jax.tar.gz -C $REMOTE_DIR; \
cd $REMOTE_DIR && VENV=\$HOME/$REMOTE_VENV launch/setup_host.sh tpu"
  if [[ -n "$BUCKET" ]]; then
    on_workers all "set -e; export GCSFUSE_REPO=gcsfuse-\$(lsb_release -c -s); \
      echo \"deb https://packages.cloud.google.com/apt \$GCSFUSE_REPO main\" | sudo tee /etc/apt/sources.list.d/gcsfuse.list; \
      curl -s https://packages.cloud.google.com/apt/doc/apt-key.gpg | sudo apt-key add -; \
      sudo apt-get update -q && sudo apt-get install -y -q gcsfuse; \
      sudo mkdir -p /mnt/gcs && sudo chown \$USER /mnt/gcs; \
      mountpoint -q /mnt/gcs || gcsfuse -o ro --implicit-dirs ${BUCKET#gs://} /mnt/gcs"
  fi
  rm -rf "$tmp"
}

resolve() {
  # Before paying for a slice: on this machine (Linux x86-64, python3.11 or $PYTHON), pip's
  # resolver resolves what `install` installs on every worker and checks jax, jaxlib and libtpu
  # against setup.cfg's pins; nothing is installed.
  run "$REPO_ROOT/launch/setup_host.sh" tpu --resolve
}

train() {
  workdir_of
  on_workers all "$(job start --distributed "$(printf '%q ' "${ARGS[@]}")")"
}

watch() {
  # Supervises a spot / queued slice from outside it: recreated whenever it is gone or
  # preempted, then reinstalled and restarted; ends when the run has final_metrics.json.
  workdir_of
  local state
  while :; do
    if [[ $OPT_QUEUED == 1 ]]; then state="$(queued_state)"; else state="$(vm_state)"; fi
    echo "[watch] $TPU_NAME: ${state:-GONE}"
    case "$state" in
      READY | ACTIVE)
        if on_workers 0 "$(job status --workdir="$WORKDIR")" | grep -q '^finished'; then break; fi
        on_workers 0 "$(job status --workdir="$WORKDIR")" | grep -q '^running' || train ;;
      CREATING | PROVISIONING | WAITING_FOR_RESOURCES | ACCEPTED | STARTING | RESTARTING) ;;
      *)  # PREEMPTED, SUSPENDED, FAILED, TERMINATED or gone: a new slice, same workdir
        delete || true
        create
        install
        train ;;
    esac
    if [[ $DRY_RUN == 1 ]]; then break; fi
    sleep "${WATCH_EVERY:-60}"
  done
}

delete() {
  if [[ $OPT_QUEUED == 1 ]]; then
    gcloud_tpu queued-resources delete "$TPU_NAME" --force --quiet
  else
    gcloud_tpu tpu-vm delete "$TPU_NAME" --quiet
  fi
}

cmd="${1:-}"
shift || true
take_options "$@"
# Everything runs from main, called on the last line: bash has then read the whole file,
# so editing or updating the checkout while a job runs cannot change what runs.
main() {
  case "$cmd" in
    create) create ;;
    resolve) resolve ;;
    install) install ;;
    train) train ;;
    attach) workdir_of && on_workers 0 "$(job attach --workdir="$WORKDIR")" ;;
    status) workdir_of && on_workers all "$(job status --workdir="$WORKDIR")" ;;
    stop) workdir_of && on_workers all "$(job stop --workdir="$WORKDIR")" ;;
    watch) watch ;;
    delete) delete ;;
    *)
      echo "usage: $0 [--dry_run] {create|resolve|install|train|attach|status|stop|watch|delete} [--spot] [--queued] [gpn_jax.train flags...]" >&2
      exit 2
      ;;
  esac
}
main "$@"; exit $?
