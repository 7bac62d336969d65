#!/usr/bin/env bash
# Configures and builds Sluice into ./build (binaries in build/bin). Run scripts/setup.sh first.
# Extra arguments go to cmake's configure step, e.g. -DSLUICE_WERROR=ON.
# Environment: SLUICE_BUILD_DIR (default build), SLUICE_BUILD_TARGETS (default: everything),
# SLUICE_BUILD_JOBS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$PWD/.venv
[ -x "$VENV/bin/python" ] || { echo "no .venv: run scripts/setup.sh first" >&2; exit 1; }
TORCH_DIR=$("$VENV/bin/python" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "share/cmake/Torch"))')
BUILD_DIR=${SLUICE_BUILD_DIR:-build}
export CCACHE_DIR=${CCACHE_DIR:-$PWD/.cache/ccache}
# The CUDA toolkit scripts/setup.sh chose for LibTorch's CMake configuration (an installed one of
# torch's CUDA version, or .venv/cuda made from PyPI).
cuda=()
if [ -s "$VENV/cuda-root" ]; then
  cuda_root=$(cat "$VENV/cuda-root")
  cuda=(-DCUDA_TOOLKIT_ROOT_DIR="$cuda_root" -DCMAKE_CUDA_COMPILER="$cuda_root/bin/nvcc")
fi
cmake -S . -B "$BUILD_DIR" -G Ninja -DTorch_DIR="$TORCH_DIR" "${cuda[@]}" "$@"
# Two cores and heavy LibTorch translation units: more parallel jobs only swap.
targets=()
for target in ${SLUICE_BUILD_TARGETS:-}; do targets+=(--target "$target"); done
cmake --build "$BUILD_DIR" -j "${SLUICE_BUILD_JOBS:-2}" "${targets[@]}"
