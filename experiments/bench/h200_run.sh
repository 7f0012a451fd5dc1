# The prepared run on a lent H200 (experiments/bench/README.md, "--device"): one call of the device
# tool, from the repository root, carrying .whl (the wheels the image lacks):
#   run(command="bash experiments/bench/h200_run.sh", carry=[".whl"], timeout_s=540)
# Check here first: python experiments/bench/accel_bench.py --plan=h100 (the wheels, the plan).
# It installs the carried wheels and the project (--no-deps: the image's jax 0.11.2 stays),
# prints versions, then runs accel_bench.py --device (the plan for the GPU found, about
# 7 minutes at most, compile cache in runs/jax_cache) into $OUT, with its whole output
# (the versions and GPU lines too) in $OUT/log.txt. Rehearsed here with
#   OUT=/tmp/x ACCEL_ARGS="--rehearse --parts=passes" bash experiments/bench/h200_run.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
OUT=${OUT:-runs/accel_device}
mkdir -p "$OUT" /tmp/site
ls .whl/*.whl >/dev/null 2>&1 || { echo "h200_run: error: .whl/: no wheel file; run accel_bench.py --plan here first (experiments/bench/README.md)" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
# the project's metadata (its code runs from this checkout, first on the path); not fatal
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
  --target /tmp/site . >/dev/null 2>&1 || echo "h200_run: project not installed; running from the checkout"
export PYTHONPATH=$PWD:/tmp/site
{ python3 -c "import sys, jax, flax, optax, ml_collections; print(sys.version.split()[0], 'jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
} 2>&1 | tee "$OUT/log.txt"
set -o pipefail
timeout 470 python3 experiments/bench/accel_bench.py ${ACCEL_ARGS:---device} --out="$OUT" 2>&1 | tee -a "$OUT/log.txt"
