#!/usr/bin/env bash
# Cloud TPU VM (single host or a multi-host pod slice): create, install, train, delete.
#
#   launch/tpu_vm.sh create
#   launch/tpu_vm.sh install
#   launch/tpu_vm.sh train --config=experiments/configs/gpn_m_1l_130m.py --workdir=gs://my-bucket/runs/gpn_m_1l \
#       --config.data.source=bin:/mnt/gcs/data/fineweb_edu --config.data.tokenizer_path=/mnt/gcs/data/llama2.model
#   launch/tpu_vm.sh delete
#
# `train` runs the same absl command on every worker (`--worker=all`); on a multi-host slice
# `gpn_jax.train` calls jax.distributed.initialize(), which finds the other hosts itself.
# Settings (environment): TPU_NAME, ZONE, ACCELERATOR_TYPE, RUNTIME_VERSION, PROJECT (optional),
# BUCKET (optional: a gs:// bucket; `train` defaults to --workdir=$BUCKET/runs/$TPU_NAME, and
# `install` mounts it read-mostly with gcsfuse at /mnt/gcs for the data).
# The workdir is a gs:// URL, never the gcsfuse mount: orbax writes GCS natively (each host its
# shards, committed with commit_success.txt), whereas directory renames on gcsfuse - orbax's
# commit on a filesystem - are not atomic. `train` refuses a workdir under /mnt/gcs.
set -euo pipefail

TPU_NAME="${TPU_NAME:-gpn-tpu}"
ZONE="${ZONE:-us-central2-b}"
ACCELERATOR_TYPE="${ACCELERATOR_TYPE:-v4-32}"
RUNTIME_VERSION="${RUNTIME_VERSION:-tpu-ubuntu2204-base}"
PROJECT="${PROJECT:-}"
BUCKET="${BUCKET:-}"
REMOTE_DIR="${REMOTE_DIR:-gpn_jax}"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

gcloud_tpu() {
  local project_flag=()
  if [[ -n "$PROJECT" ]]; then project_flag=(--project="$PROJECT"); fi
  gcloud compute tpus tpu-vm "$@" --zone="$ZONE" "${project_flag[@]}"
}

on_all_workers() {
  gcloud_tpu ssh "$TPU_NAME" --worker=all --command="$1"
}

cmd="${1:-}"
shift || true
case "$cmd" in
  create)
    gcloud_tpu create "$TPU_NAME" --accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION"
    ;;
  install)
    # Ship this checkout (committed files) to every worker and install it with JAX for TPU.
    archive="$(mktemp -d)/gpn_jax.tar.gz"
    git -C "$REPO_ROOT" archive --format=tar.gz -o "$archive" HEAD
    gcloud_tpu scp "$archive" "$TPU_NAME":gpn_jax.tar.gz --worker=all
    on_all_workers "set -e; rm -rf $REMOTE_DIR; mkdir -p $REMOTE_DIR; tar -xzf gpn_jax.tar.gz -C $REMOTE_DIR; \
      python3 -m pip install -U pip; python3 -m pip install -U 'jax[tpu]'; python3 -m pip install -e ./$REMOTE_DIR; \
      python3 -m pip install gcsfs google-cloud-storage"  # gs:// workdirs: epath (fsspec) + orbax
    if [[ -n "$BUCKET" ]]; then
      on_all_workers "set -e; export GCSFUSE_REPO=gcsfuse-\$(lsb_release -c -s); \
        echo \"deb https://packages.cloud.google.com/apt \$GCSFUSE_REPO main\" | sudo tee /etc/apt/sources.list.d/gcsfuse.list; \
        curl -s https://packages.cloud.google.com/apt/doc/apt-key.gpg | sudo apt-key add -; \
        sudo apt-get update -q && sudo apt-get install -y -q gcsfuse; \
        sudo mkdir -p /mnt/gcs && sudo chown \$USER /mnt/gcs; \
        mountpoint -q /mnt/gcs || gcsfuse --implicit-dirs ${BUCKET#gs://} /mnt/gcs"
    fi
    ;;
  train)
    # The same command on every worker; "$@" are gpn_jax.train flags (quoted for the remote shell).
    workdir_given=0
    for a in "$@"; do
      case "$a" in
        --workdir=/mnt/gcs*)
          echo "use --workdir=gs://... rather than the gcsfuse mount (renames there are not atomic)" >&2
          exit 2 ;;
        --workdir=*) workdir_given=1 ;;
      esac
    done
    if [[ $workdir_given == 0 && -n "$BUCKET" ]]; then set -- "$@" "--workdir=${BUCKET%/}/runs/$TPU_NAME"; fi
    args="$(printf ' %q' "$@")"
    on_all_workers "cd $REMOTE_DIR && python3 -m gpn_jax.train --distributed$args"
    ;;
  delete)
    gcloud_tpu delete "$TPU_NAME" --quiet
    ;;
  *)
    echo "usage: $0 {create|install|train [gpn_jax.train flags...]|delete}" >&2
    exit 2
    ;;
esac
