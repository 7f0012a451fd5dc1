#!/usr/bin/env bash
# Rehearses docs/paper_run.md on this CPU: runs the page's `bash rehearse` blocks in order, at
# tiny scale, with stand-ins for gcloud, ssh and sbatch (launch/standins/) that run every worker
# as a local process (the TPU slice: 2 hosts x 1 CPU device joined by jax.distributed). Midway
# it sends SIGTERM to one TPU host's trainer; the launcher's resume loop takes the run to its
# last step. It ends with the evaluations, the export and the comparison tables, then checks
# what they show.
#
#   bash launch/rehearse.sh [DIR]     # DIR: where everything goes (default: a new temp dir)
#
# The TPU workers run this checkout's committed HEAD (`launch/tpu_vm.sh install` ships
# `git archive HEAD`); the GPU node a `git clone` of it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ -n "${1:-}" ]]; then mkdir -p "$1"; R="$(cd "$1" && pwd)"; else R="$(mktemp -d -t gpn-rehearsal-XXXXXX)"; fi
echo "[rehearsal] in $R"

# --- the machine: stand-ins first on PATH, this checkout importable, JAX on one CPU device
export PATH="$ROOT/launch/standins:$PATH" PYTHONPATH="$ROOT" GPN_STANDIN_ROOT="$R/standin"
export GPN_STANDIN_PYTHON="$(command -v python3)" GPN_STANDIN_WORKERS=2 GPN_STANDIN_DEVICES=1
# (GPN_STANDIN_XLA_FLAGS, GPN_STANDIN_JAX_CACHE_DIR: the compile settings of every host and of
# this machine's own commands; unset, XLA's defaults and no cache, as on a fresh machine)
export JAX_PLATFORMS=cpu XLA_FLAGS="${GPN_STANDIN_XLA_FLAGS:-} --xla_force_host_platform_device_count=1"
if [[ -n "${GPN_STANDIN_JAX_CACHE_DIR:-}" ]]; then export JAX_COMPILATION_CACHE_DIR="$GPN_STANDIN_JAX_CACHE_DIR"; fi
export GPN_RESTART_DELAY=1 GPN_FINAL_GRACE=120 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
# `tpu_vm.sh install` ships HEAD and refuses a checkout with uncommitted edits; the rehearsal runs
# on a working tree too (HEAD is what its stand-in hosts run, as on a real slice)
export GPN_ALLOW_DIRTY=1
# every stand-in host shares this machine's C++ kernel build (gpn_jax/kernels/cpu/build_cache.py)
export GPN_JAX_NATIVE_CACHE="${GPN_JAX_NATIVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpn_jax/native}"
export VENV="$R/standin/login/gpn_venv"  # the Slurm login node's environment (a stand-in)
python3 -c "import sys; sys.path.insert(0, 'launch/standins'); import _vm; _vm.host_home('login')"
COORDINATOR_PORT="$(python3 -c "import sys; sys.path.insert(0, 'launch/standins'); import _vm; print(_vm.free_port())")"
export COORDINATOR_PORT

# --- the page's variables (docs/paper_run.md, "Settings"), at rehearsal scale
export REHEARSAL_STEPS=40
export RAW="$R/raw" TOKENIZER="$R/tokenizer/tokenizer.model" DATA="$R/data" TPU_DATA="$R/data"
export LAMBADA="$R/lambada.jsonl" TASKS=rehearsal_lambada TASKS_DIR="$R/tasks"
export GPN_M=experiments/configs/gpn_m_1l_130m.py:cpu
export TPP=experiments/configs/transformer_130m.py:cpu
export GDN=experiments/configs/gdn_130m.py:cpu
export FLAGS="--config.train.steps=$REHEARSAL_STEPS --config.train.batch_size=4 \
--config.train.seq_len=32 --config.train.warmup_steps=2 --config.train.log_every=1 \
--config.train.eval_every=0 --config.train.checkpoint_every=20 --config.train.final_eval_batches=2 \
--config.logging.progress_bar=false"
export TPU_NAME=rehearsal ZONE=standin ACCELERATOR_TYPE=v5p-16 RUNTIME_VERSION=standin
export PROJECT="" BUCKET="" TOPOLOGY=v5e:2x2
export RUN="$R/runs/gpn_m" GPU_HOST=gpu0 REPO_URL="$ROOT"
export RUN_TPP="$R/runs/transformer" RUN_GDN="$R/runs/gdn" EVAL="$R/eval" EXPORT="$R/exports"
for name in $(python3 launch/rehearsal.py env docs/paper_run.md); do
  [[ -v $name ]] || { echo "[rehearsal] the page's variable $name has no rehearsal value" >&2; exit 2; }
done

# --- what the user downloads (stand-ins), then the page
python3 launch/rehearsal.py data "$R"
python3 launch/rehearsal.py blocks docs/paper_run.md >"$R/page.sh"
python3 launch/rehearsal.py preempt "$RUN" "$R/preempted.json" &
preempter=$!
cleanup() {  # whatever happens, no job of the rehearsal outlives it
  kill "$preempter" 2>/dev/null || true
  for f in "$R"/runs/*/job/*.loop.pid; do
    [[ -f "$f" ]] && kill -KILL -- "-$(cut -d' ' -f1 "$f")" 2>/dev/null || true
  done
}
trap cleanup EXIT
(cd "$ROOT" && bash -euxo pipefail "$R/page.sh")
wait "$preempter"
python3 launch/rehearsal.py check "$R"
