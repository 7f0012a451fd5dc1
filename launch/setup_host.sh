#!/usr/bin/env bash
# Installs this checkout on one host, run from the checkout's root: a virtual environment at
# $VENV (~/gpn_venv) on a Python >= 3.11 (the package's python_requires), then
# `pip install -e ".[EXTRA]"`, whose pins keep jax and its accelerator plugin at one version.
#
#   launch/setup_host.sh tpu          # a Cloud TPU VM: .[tpu] (+ gcsfs for gs:// workdirs)
#   launch/setup_host.sh gpu          # an NVIDIA node: .[gpu] (CUDA 12 wheels)
#   launch/setup_host.sh tpu --resolve[=REPORT.json]   # resolve the same install, install nothing
#
# Where the image's python3 is older (tpu-ubuntu2204-base ships 3.10), python3.11 comes from
# the deadsnakes PPA (Ubuntu) unless $PYTHON names an interpreter >= 3.11. `--resolve` runs on
# any Linux x86-64 machine before a host is paid for: pip's resolver, in a throwaway venv on
# ${PYTHON:-python3.11} (the TPU images' Python), resolves this very install and
# launch/resolve_install.py checks that jax, jaxlib and libtpu (or the CUDA plugin) come out at
# setup.cfg's pins.
set -euo pipefail
EXTRA="${1:?usage: launch/setup_host.sh tpu|gpu [--resolve[=REPORT.json]]}"
RESOLVE="${2:-}"
if [[ "$RESOLVE" == --resolve=[^/]* ]]; then RESOLVE="--resolve=$PWD/${RESOLVE#--resolve=}"; fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PACKAGES=(-e ".[$EXTRA]")
if [[ "$EXTRA" == tpu ]]; then
  PACKAGES+=(gcsfs google-cloud-storage)  # gs:// workdirs (etils, orbax)
fi

if [[ "$RESOLVE" == --resolve* ]]; then
  PY="${PYTHON:-python3.11}"
  command -v "$PY" >/dev/null || {
    echo "launch/setup_host.sh: error: $PY: not found; --resolve runs the host's Python (the TPU images': python3.11), or set PYTHON" >&2
    exit 2
  }
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  "$PY" -m venv "$tmp/venv"
  "$tmp/venv/bin/python" -m pip install -q -U pip
  report="${RESOLVE#--resolve}"
  "$tmp/venv/bin/python" launch/resolve_install.py "$EXTRA" "${report#=}" "${PACKAGES[@]}"
  exit 0
fi
VENV="${VENV:-$HOME/gpn_venv}"

new_enough() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }

if [[ ! -x "$VENV/bin/python" ]]; then
  PY="${PYTHON:-python3}"
  if ! new_enough "$PY"; then
    PY=python3.11
    if ! command -v "$PY" >/dev/null; then
      sudo apt-get update -q
      sudo apt-get install -y -q software-properties-common
      sudo add-apt-repository -y ppa:deadsnakes/ppa
      sudo apt-get update -q
      sudo apt-get install -y -q python3.11 python3.11-venv
    fi
  fi
  "$PY" -m venv "$VENV"
fi
new_enough "$VENV/bin/python" || { echo "$VENV: Python < 3.11; remove it and rerun" >&2; exit 2; }
"$VENV/bin/python" -m pip install -q -U pip
"$VENV/bin/python" -m pip install -q "${PACKAGES[@]}"
"$VENV/bin/python" -c 'import jax; print("jax", jax.__version__, jax.default_backend(), jax.local_device_count(), "local devices")'
