#!/usr/bin/env bash
# Installs everything Sluice needs to build, run and test on a fresh Debian 12 or Ubuntu 24.04
# machine: distribution packages (compiler toolchain, gRPC, Protobuf, spdlog, prometheus-cpp,
# GoogleTest, CLI11), a virtual environment in ./.venv with the pinned PyPI packages (torch
# provides LibTorch), and the third-party perf_analyzer binary. Idempotent: each step checks
# whether it is already done.
# SLUICE_SETUP_PROFILE=build (the container image's build stage) installs only what building
# needs: no test tools (Prometheus, valgrind, clang, openssl, nginx, perf_analyzer).
set -euo pipefail
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
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libspdlog-dev libfmt-dev prometheus-cpp-dev libcli11-dev libgtest-dev libgmock-dev nlohmann-json3-dev
  libevent-dev rapidjson-dev zlib1g-dev  # the HTTP/REST endpoint
)
if [ "$PROFILE" = test ]; then
  APT_PACKAGES+=(
    libb64-0d  # perf_analyzer's one shared-library need beyond libc and OpenSSL
    openssl     # the TLS tests make certificates
    curl        # the HTTP tests call the REST endpoint as users do
    prometheus  # the metrics tests scrape the server with a real Prometheus
    valgrind    # the metrics cost benchmark counts instructions with callgrind
    linux-perf  # benchmarks/request_path_profile.py samples the server with perf
    patchelf    # the GPU proof kit rewrites its binaries' RUNPATH (scripts/gpu_kit.sh)
    clang "$CLANG_RT"  # libFuzzer and the sanitizer runtimes (scripts/fuzz.sh)
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

PYTHON=${PYTHON:-python3}
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

if [ "$PROFILE" = build ]; then
  log "done (build profile: no test tools)"
  exit 0
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
