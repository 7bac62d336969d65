#!/usr/bin/env bash
# Installs everything Sluice needs to build, run and test on a fresh Debian 12 or Ubuntu 24.04
# machine: distribution packages (compiler toolchain, gRPC, Protobuf, spdlog, prometheus-cpp,
# GoogleTest, CLI11), a virtual environment in ./.venv with the pinned PyPI packages (torch
# provides LibTorch), KServe's SDK in ./.venv-kserve, and the third-party perf_analyzer binary. Idempotent: each step checks
# whether it is already done.
# SLUICE_SETUP_PROFILE=build (the container image's build stage) installs only what building
# needs: no test tools (Prometheus, valgrind, the sanitizer runtimes, openssl, nginx, perf_analyzer).
#   scripts/setup.sh            # everything
#   scripts/setup.sh --system   # the distribution packages only (enough for -DSLUICE_TORCH=OFF)
set -euo pipefail
case "${1:-}" in
  "") SYSTEM_ONLY=0 ;;
  --system) SYSTEM_ONLY=1 ;;
  *) echo "usage: scripts/setup.sh [--system]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venv
PROFILE=${SLUICE_SETUP_PROFILE:-test}
case "$PROFILE" in build|test) ;; *) echo "SLUICE_SETUP_PROFILE must be build or test" >&2; exit 2 ;; esac

# shellcheck source=/dev/null
. /etc/os-release
case "${ID}:${VERSION_ID}" in
  debian:12) CLANG_RT=libclang-rt-14-dev NGINX=nginx-light ;;
  ubuntu:24.04) CLANG_RT=libclang-rt-18-dev NGINX=nginx ;;
  *) echo "[setup] warning: ${PRETTY_NAME:-this system} is not Debian 12 or Ubuntu 24.04; trying anyway" >&2
     CLANG_RT=libclang-rt-dev NGINX=nginx ;;
esac

APT_PACKAGES=(
  build-essential cmake ninja-build ccache git pkg-config python3-venv unzip
  clang  # the compiler scripts/build.sh uses (its -Wthread-safety checks every lock annotation)
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libspdlog-dev libfmt-dev prometheus-cpp-dev libcli11-dev libgtest-dev libgmock-dev nlohmann-json3-dev
  libevent-dev rapidjson-dev zlib1g-dev  # the HTTP/REST endpoint
  libssl-dev  # libcrypto's SHA-256 for pinned model files (gRPC links the same library)
  patchelf  # the bundled torchvision operators drop their unused libtorch_python.so dependency;
            # the GPU proof kit rewrites its binaries' RUNPATH (scripts/gpu_kit.sh)
)
if [ "$PROFILE" = test ]; then
  APT_PACKAGES+=(
    libb64-0d  # perf_analyzer's one shared-library need beyond libc and OpenSSL
    openssl     # the TLS tests make certificates
    curl        # the HTTP tests call the REST endpoint as users do
    prometheus  # the metrics tests scrape the server with a real Prometheus
    valgrind    # the metrics cost benchmark counts instructions with callgrind
    linux-perf  # benchmarks/request_path_profile.py samples the server with perf
    clang-format  # the test command checks the C++ files' format (scripts/check_format.sh)
    "$CLANG_RT"  # libFuzzer and the sanitizer runtimes (scripts/fuzz.sh, ThreadSanitizer)
    llvm        # llvm-symbolizer: sanitizer reports name their frames, which the suppressions match
    "$NGINX" libnginx-mod-stream  # the load-balancer tests (L7 grpc_pass, L4 stream)
  )
fi

log() { printf '[setup] %s\n' "$*"; }

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  log "apt-get install ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  log "Debian packages: all present"
fi
[ "$SYSTEM_ONLY" -eq 0 ] || exit 0

PYTHON=${PYTHON:-python3}

# KServe's Python SDK for tests/integration/test_kserve_client.py, in a virtual environment of its
# own (kserve and tritonclient register the same protobuf names).
# Installed in the background, beside the main environment's pip install (each pip run keeps one
# core busy: about 50 s of a 200 s setup with warm caches); waited for before perf_analyzer.
KSERVE_VENV=$ROOT/.venv-kserve
kserve_setup() {
  if [ ! -x "$KSERVE_VENV/bin/python" ]; then
    log "creating virtual environment $KSERVE_VENV"
    "$PYTHON" -m venv "$KSERVE_VENV"
  fi
  local stamp want
  stamp=$KSERVE_VENV/.requirements.sha256
  want=$(sha256sum requirements-kserve.txt | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    log "pip install -r requirements-kserve.txt (KServe's SDK, into $KSERVE_VENV)"
    "$KSERVE_VENV/bin/pip" install -q --disable-pip-version-check -r requirements-kserve.txt
    echo "$want" >"$stamp"
  fi
}
kserve_pid=
if [ "$PROFILE" = test ]; then
  kserve_setup &
  kserve_pid=$!
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi
stamp=$VENV/.requirements.sha256
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "pip install -r requirements.txt (torch is large: the first run takes a few minutes)"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r requirements.txt
  echo "$want" >"$stamp"
else
  log "Python packages: up to date"
fi

# LibTorch's CMake configuration (find_package(Torch)) needs a CUDA toolkit of the torch wheel's
# CUDA version: nvcc and the headers the wheel lacks. A machine that has one keeps using it;
# elsewhere the toolkit's compiler comes from PyPI (requirements-cuda.txt, the same line-up) and is
# merged with the wheel's own CUDA headers and libraries into .venv/cuda. .venv/cuda-root names the
# toolkit scripts/build.sh gives CMake. SLUICE_CUDA_TOOLKIT=pypi takes the PyPI route even where a
# toolkit is installed (to check that route on a machine that has one).
want_cuda=$("$VENV/bin/python" -c 'import torch; print(torch.version.cuda or "")')
rm -f "$VENV/cuda-root"
if [ -n "$want_cuda" ]; then
  system_cuda=""
  if [ "${SLUICE_CUDA_TOOLKIT:-auto}" != pypi ]; then
    for nvcc in ${CUDA_HOME:+"$CUDA_HOME/bin/nvcc"} "$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc; do
      [ -n "$nvcc" ] && [ -x "$nvcc" ] || continue
      version=$("$nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9.]*\),.*/\1/p')
      if [ "$version" = "$want_cuda" ]; then
        system_cuda=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
        break
      fi
    done
  fi
  if [ -n "$system_cuda" ]; then
    log "CUDA toolkit: $system_cuda (CUDA $want_cuda, as torch)"
    echo "$system_cuda" >"$VENV/cuda-root"
  else
    pinned=$(sed -n 's/^nvidia-cuda-nvcc==\([0-9]*\.[0-9]*\).*/\1/p' requirements-cuda.txt)
    if [ "$pinned" != "$want_cuda" ]; then
      echo "[setup] torch is built for CUDA $want_cuda but requirements-cuda.txt pins CUDA $pinned: change them together" >&2
      exit 1
    fi
    cuda_stamp=$VENV/.requirements-cuda.sha256
    if [ "$(cat "$cuda_stamp" 2>/dev/null)" != "$(sha256sum requirements-cuda.txt | cut -d' ' -f1)" ]; then
      log "no CUDA $want_cuda toolkit found: pip install -r requirements-cuda.txt (nvcc for LibTorch's CMake)"
      "$VENV/bin/pip" install -q --disable-pip-version-check -r requirements-cuda.txt
      sha256sum requirements-cuda.txt | cut -d' ' -f1 >"$cuda_stamp"
    fi
    # One root as CMake's FindCUDA expects it: bin/, include/, nvvm/ and lib64/ (lib as a link),
    # every library also under its unversioned name (the toolkit's development links). nvcc finds
    # the rest of the toolkit (lib64 with libcudadevrt.a and libcudart_static.a) from where its
    # own file really is, so bin/ holds hard links (a copy across file systems), not a symlink to
    # the wheel's bin/, which has no lib64 beside it.
    wheel_cuda=$("$VENV/bin/python" -c 'import os, nvidia; print(os.path.join(list(nvidia.__path__)[0], "cu" + "'"${want_cuda%%.*}"'"))')
    [ -x "$wheel_cuda/bin/nvcc" ] || { echo "[setup] no nvcc in $wheel_cuda after installing requirements-cuda.txt" >&2; exit 1; }
    root=$VENV/cuda
    rm -rf "$root"
    mkdir -p "$root/lib64"
    for part in include nvvm; do ln -s "$wheel_cuda/$part" "$root/$part"; done
    cp -al "$wheel_cuda/bin" "$root/bin" 2>/dev/null || cp -a "$wheel_cuda/bin" "$root/bin"
    for library in "$wheel_cuda"/lib/*; do
      name=$(basename "$library")
      ln -sf "$library" "$root/lib64/$name"
      case "$name" in *.so.*) [ -e "$root/lib64/${name%%.so.*}.so" ] || ln -s "$library" "$root/lib64/${name%%.so.*}.so" ;; esac
    done
    ln -s lib64 "$root/lib"
    log "CUDA toolkit: $root (PyPI's nvcc $("$root/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p') with the torch wheel's CUDA $want_cuda)"
    echo "$root" >"$VENV/cuda-root"
  fi
fi

if [ "$PROFILE" = build ]; then
  log "done (build profile: no test tools)"
  exit 0
fi

# KServe's SDK (started in the background above) must have installed.
if [ -n "${kserve_pid:-}" ] && ! wait "$kserve_pid"; then
  echo "[setup] KServe's SDK did not install into .venv-kserve (see pip's output above)" >&2
  exit 1
fi

# perf_analyzer is not published on PyPI on its own any more (the perf-analyzer project there is a
# placeholder). tritonclient 2.50.0's manylinux wheel still carries the binary, built for glibc 2.35
# and CUDA 12; it needs libcudart.so.12 (from nvidia-cuda-runtime-cu12) even against a CPU server.
# Both are unpacked into .venv/opt/perf_analyzer, away from the torch's CUDA 13 libraries, and a
# wrapper on the venv's PATH points the loader at them.
PA_DIR=$VENV/opt/perf_analyzer
if [ ! -x "$PA_DIR/perf_analyzer" ] || [ ! -e "$PA_DIR/lib/libcudart.so.12" ]; then
  log "fetching perf_analyzer (tritonclient 2.50.0 wheel) and libcudart.so.12"
  tmp=$(mktemp -d)
  "$VENV/bin/pip" download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform manylinux1_x86_64 -d "$tmp" tritonclient==2.50.0
  "$VENV/bin/pip" download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    -d "$tmp" nvidia-cuda-runtime-cu12==12.9.79
  mkdir -p "$PA_DIR/lib"
  unzip -o -q -j "$tmp"/tritonclient-2.50.0-*.whl 'tritonclient-2.50.0.data/data/bin/perf_analyzer' -d "$PA_DIR"
  unzip -o -q -j "$tmp"/nvidia_cuda_runtime_cu12-*.whl 'nvidia/cuda_runtime/lib/libcudart.so.12' -d "$PA_DIR/lib"
  chmod +x "$PA_DIR/perf_analyzer"
  rm -rf "$tmp"
fi
cat >"$VENV/bin/perf_analyzer" <<WRAP
#!/usr/bin/env bash
export LD_LIBRARY_PATH="$PA_DIR/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$PA_DIR/perf_analyzer" "\$@"
WRAP
chmod +x "$VENV/bin/perf_analyzer"
"$VENV/bin/perf_analyzer" --version >/dev/null 2>&1 || { echo "perf_analyzer does not start" >&2; exit 1; }
log "done"
