#!/usr/bin/env bash
# One GPU node, one process driving all its GPUs (the mesh spans them; -1 = all devices).
#
#   pip install -U "jax[cuda12]" && pip install -e .          # once
#   launch/gpu_single_node.sh --config=experiments/configs/gpn_m_1l_130m.py --workdir=/data/runs/gpn_m_1l \
#       --config.data.source=bin:/data/fineweb_edu --config.data.tokenizer_path=/data/llama2.model
#
# Every argument goes to `python -m gpn_jax.train` unchanged (e.g. --config.mesh.fsdp=8).
# CUDA_VISIBLE_DEVICES picks the GPUs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Let XLA overlap collectives with compute, and give JAX most of each GPU's memory.
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_latency_hiding_scheduler=true"
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}"

exec python -m gpn_jax.train "$@"
