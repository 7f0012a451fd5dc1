#!/usr/bin/env bash
# One GPU node, one process driving all its GPUs (the mesh spans them; -1 = all devices).
# Run on the node, from a checkout of this repository (e.g. over ssh):
#
#   launch/gpu_single_node.sh install                 # venv (Python >= 3.11) + pip install -e ".[gpu]"
#   launch/gpu_single_node.sh start --config=experiments/configs/gpn_m_1l_130m.py \
#       --workdir=/data/runs/gpn_m_1l --config.data.source=bin:/data/fineweb_edu \
#       --config.data.tokenizer_path=/data/llama2/tokenizer.model
#   launch/gpu_single_node.sh attach --workdir=/data/runs/gpn_m_1l   # follow the log
#   launch/gpu_single_node.sh status --workdir=/data/runs/gpn_m_1l
#   launch/gpu_single_node.sh stop --workdir=/data/runs/gpn_m_1l     # save a checkpoint, stop
#   launch/gpu_single_node.sh --dry_run <any of the above>             # print, run nothing
#
# `start` runs launch/job.sh detached (its own session: it outlives the ssh session), which
# restarts `python -m gpn_jax.train FLAGS` after a SIGTERM or a crash, resuming from the newest
# checkpoint, until final_metrics.json exists; its log is <workdir>/job/<host>.log. Flags after
# the subcommand go to gpn_jax.train unchanged (e.g. --config.mesh.fsdp=8).
# CUDA_VISIBLE_DEVICES picks the GPUs; VENV (~/gpn_venv) is the environment `install` made.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${VENV:-$HOME/gpn_venv}"

DRY=()
if [[ "${1:-}" == "--dry_run" ]]; then DRY=(--dry_run); shift; fi
cmd="${1:-}"
shift || true

# Let XLA overlap collectives with compute, and give JAX most of each GPU's memory.
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_latency_hiding_scheduler=true"
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}"
export GPN_PYTHON="${GPN_PYTHON:-$VENV/bin/python}"

case "$cmd" in
  install)
    if [[ ${#DRY[@]} == 1 ]]; then
      echo "+ VENV=$VENV launch/setup_host.sh gpu"
    else
      VENV="$VENV" launch/setup_host.sh gpu
    fi
    ;;
  start | attach | status | stop) exec launch/job.sh "${DRY[@]}" "$cmd" "$@" ;;
  *)
    echo "usage: $0 [--dry_run] {install|start|attach|status|stop} [gpn_jax.train flags...]" >&2
    exit 2
    ;;
esac
