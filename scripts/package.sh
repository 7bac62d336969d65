#!/usr/bin/env bash
# Stages what the runtime container image holds, under DEST (default build/package), from a
# finished build (scripts/build.sh) and generated example models (models/generate_models.py):
#   bin/sluice-server, bin/sluice-client   installed by CMake, RPATH $ORIGIN/../lib and
#                                          $ORIGIN/../python/torch/lib (nothing points back
#                                          at the build tree or the virtual environment)
#   lib/                the shared libraries the binaries need beyond glibc and libstdc++
#                       (gRPC, protobuf, abseil, spdlog, fmt, prometheus-cpp, ...), found with ldd
#   python/torch/lib    LibTorch from the torch wheel, and python/nvidia/*/lib the CUDA and cuDNN
#                       libraries the wheel depends on, in the wheel's own layout (LibTorch's
#                       RPATH is $ORIGIN/../../nvidia/...), but libcudart in lib/ (the server
#                       needs it directly); each library is in the image once. The image's
#                       base is a plain Debian: the driver's libcuda is mounted by the NVIDIA
#                       container toolkit.
#   models/             the bundled example models with their weights
#   VERSIONS            the line-up (sluice, torch, CUDA, cuDNN), read by docker/image-tag.sh
# --link puts symbolic links to the virtual environment's torch and nvidia files instead of
# copies (3.6 GB): what the tests use to check the layout without copying it.
set -euo pipefail
cd "$(dirname "$0")/.."
LINK=0
DEST=build/package
for arg in "$@"; do
  case "$arg" in
    --link) LINK=1 ;;
    -*) echo "usage: scripts/package.sh [--link] [DEST]" >&2; exit 2 ;;
    *) DEST=$arg ;;
  esac
done
BUILD_DIR=${SLUICE_BUILD_DIR:-build}
PY=.venv/bin/python
[ -x "$BUILD_DIR/bin/sluice-server" ] || { echo "no $BUILD_DIR/bin/sluice-server: run scripts/build.sh first" >&2; exit 1; }
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

rm -rf "$DEST"
mkdir -p "$DEST/lib" "$DEST/python/torch" "$DEST/models"
DEST=$(cd "$DEST" && pwd)
cmake --install "$BUILD_DIR" --prefix "$DEST" >/dev/null

place() {  # place SOURCE_FILE TARGET_DIR
  mkdir -p "$2"
  if [ "$LINK" = 1 ]; then ln -sf "$(realpath "$1")" "$2/"; else cp -L "$1" "$2/"; fi
}

# LibTorch and the wheel's CUDA/cuDNN libraries.
for f in "$SITE"/torch/lib/*.so*; do place "$f" "$DEST/python/torch/lib"; done
for dir in "$SITE"/nvidia/*/lib; do
  name=$(basename "$(dirname "$dir")")
  for f in "$dir"/*.so*; do
    case "$(basename "$f")" in
      # The server needs libcudart itself, and its RUNPATH does not reach nvidia/*/lib: it goes
      # beside the other libraries the binaries load (LibTorch then finds it loaded).
      libcudart.so*) place "$f" "$DEST/lib" ;;
      *) place "$f" "$DEST/python/nvidia/$name/lib" ;;
    esac
  done
done

# Everything else the binaries load, except what every base image has (glibc, libstdc++,
# libgcc_s) and what the package or the driver provides.
for bin in "$DEST"/bin/*; do
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  case "$lib" in "$DEST"/*|*/torch/lib/*|*/nvidia/*) continue ;; esac
  case "$(basename "$lib")" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libutil.so.*|ld-linux*) continue ;;  # glibc
    libstdc++.so.*|libgcc_s.so.*) continue ;;
    libcudart.so*) continue ;;  # the torch wheel's (above), never a system toolkit's
    libcuda.so*|libnvidia-*) continue ;;  # the driver's, mounted by the NVIDIA container toolkit
  esac
  cp -L "$lib" "$DEST/lib/"
done

# The example models: their configs, and weights written by the generator (fixed seed).
for config in models/*/config.pbtxt; do
  mkdir -p "$DEST/models/$(basename "$(dirname "$config")")"
  cp "$config" "$DEST/models/$(basename "$(dirname "$config")")/"
done
"$PY" models/generate_models.py --repository "$DEST/models" >/dev/null
"$PY" -c '
import sys, torch
cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
print("sluice=" + sys.argv[1])
print("torch=" + torch.__version__.split("+")[0])
print("cuda=" + (torch.version.cuda or "none"))
print("cudnn=" + (f"{cudnn // 10000}.{cudnn // 100 % 100}.{cudnn % 100}" if cudnn else "none"))
' "$("$BUILD_DIR/bin/sluice-server" --version | awk '{print $NF}')" >"$DEST/VERSIONS"
echo "packaged into $DEST ($(du -sh --apparent-size "$DEST" | cut -f1)); $(tr '\n' ' ' <"$DEST/VERSIONS")"
