#!/usr/bin/env bash
# Configures and builds Sluice into ./build (binaries in build/bin). Run scripts/setup.sh first.
# Extra arguments go to cmake's configure step, e.g. -DSLUICE_WERROR=ON.
# Environment: SLUICE_BUILD_DIR (default build), SLUICE_BUILD_TARGETS (default: everything),
# SLUICE_BUILD_JOBS (default 2), CXX (default clang++ when installed).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$PWD/.venv
BUILD_DIR=${SLUICE_BUILD_DIR:-build}
# clang is the compiler (scripts/setup.sh installs it): it checks every lock annotation of
# server/ as it compiles (-Wthread-safety) and compiles this code about a quarter faster than
# GCC 12. CXX=g++ builds with GCC, without that check. A build directory keeps the compiler it
# was configured with.
if [ -z "${CXX:-}" ] && command -v clang++ >/dev/null; then
  export CC=clang CXX=clang++
fi
export CCACHE_DIR=${CCACHE_DIR:-$PWD/.cache/ccache}
# LibTorch from the torch wheel in .venv, and the CUDA toolkit scripts/setup.sh chose for its CMake
# configuration (an installed one of torch's CUDA version, or .venv/cuda made from PyPI); neither
# for a build without LibTorch (-DSLUICE_TORCH=OFF: Debian's packages are all it needs).
torch=()
if [[ " $* " != *" -DSLUICE_TORCH=OFF "* ]]; then
  [ -x "$VENV/bin/python" ] || { echo "no .venv: run scripts/setup.sh first" >&2; exit 1; }
  torch=(-DTorch_DIR="$("$VENV/bin/python" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "share/cmake/Torch"))')")
  if [ -s "$VENV/cuda-root" ]; then
    cuda_root=$(cat "$VENV/cuda-root")
    torch+=(-DCUDA_TOOLKIT_ROOT_DIR="$cuda_root" -DCMAKE_CUDA_COMPILER="$cuda_root/bin/nvcc")
  fi
fi
cmake -S . -B "$BUILD_DIR" -G Ninja "${torch[@]}" "$@"
# Two cores and heavy LibTorch translation units: more parallel jobs only swap.
targets=()
for target in ${SLUICE_BUILD_TARGETS:-}; do targets+=(--target "$target"); done
cmake --build "$BUILD_DIR" -j "${SLUICE_BUILD_JOBS:-2}" "${targets[@]}"
