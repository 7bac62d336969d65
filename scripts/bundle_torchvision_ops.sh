#!/usr/bin/env bash
# Makes torchvision's C++ operators (nms, roi_align, roi_pool, ps_roi_align, ps_roi_pool,
# deform_conv2d, CPU and CUDA kernels) loadable by a process without Python:
#   scripts/bundle_torchvision_ops.sh TORCHVISION_C_SO TORCH_LIB_DIR OUTPUT
# The torchvision wheel's _C.so lists libtorch_python.so as a dependency, which needs a Python
# interpreter's symbols to load, but calls nothing in it: every symbol it needs comes from
# LibTorch and the C and C++ runtimes. The copy written to OUTPUT drops that dependency and the
# wheel's build-machine RPATH (the server has LibTorch loaded already, and the dynamic loader
# matches the other dependencies by name). The check that it calls nothing of libtorch_python.so
# runs on every build: a torchvision that starts to would stop the build here, not a model load.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 TORCHVISION_C_SO TORCH_LIB_DIR OUTPUT" >&2; exit 2; }
input=$1 torch_lib=$2 output=$3
command -v patchelf >/dev/null || { echo "$0: patchelf is missing: run scripts/setup.sh --system" >&2; exit 1; }
python_lib=$torch_lib/libtorch_python.so
[ -f "$input" ] || { echo "$0: no $input" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
nm -D --undefined-only "$input" | awk '{print $NF}' | sort -u >"$work/needs"
if [ -f "$python_lib" ]; then
  nm -D --defined-only "$python_lib" | awk '{print $NF}' | sort -u >"$work/python_has"
  used=$(comm -12 "$work/needs" "$work/python_has" | head -5)
  if [ -n "$used" ]; then
    echo "$0: $input calls into libtorch_python.so (e.g. $(echo "$used" | tr '\n' ' '));" \
      "it cannot be loaded without Python: build with -DSLUICE_TORCHVISION_OPS=OFF" >&2
    exit 1
  fi
fi
if grep -q '^Py' "$work/needs"; then
  echo "$0: $input needs Python's C API ($(grep '^Py' "$work/needs" | head -3 | tr '\n' ' '))" >&2
  exit 1
fi

mkdir -p "$(dirname "$output")"
cp "$input" "$work/ops.so"
chmod u+w "$work/ops.so"
patchelf --remove-needed libtorch_python.so "$work/ops.so"
patchelf --remove-rpath "$work/ops.so"
if readelf -d "$work/ops.so" | grep -q 'libtorch_python'; then
  echo "$0: patchelf left libtorch_python.so in $output's dependencies" >&2
  exit 1
fi
mv "$work/ops.so" "$output"
