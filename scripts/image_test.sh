#!/usr/bin/env bash
# The image test: builds the container image from docker/Dockerfile exactly as users do
# (docker/build-image.sh, tagged with the line-up) and runs it as users do, then checks it from
# this machine (tests/image/check_image.py):
#   - docker run -d --read-only --tmpfs /tmp:exec on the host network (free ports; with no bridge,
#     -p cannot work), the bundled models;
#   - tritonclient gRPC and HTTP on every bundled model, equal to torch here on the same files;
#     the metrics endpoint counts them; docker inspect's health reaches "healthy"; the server runs
#     as the image's non-root uid 10001; --print-env in the image says plainly that no GPU is seen;
#   - docker stop -t 40 (past the server's 30 s grace) under load: exit code 0, no request lost;
#   - the image's size and its largest layers, failing above SIZE_BOUND_MB.
# A Docker engine that answers (DOCKER_HOST or the default socket) is used as it is. Otherwise
# this installs Debian's docker.io and starts its own dockerd (vfs storage, no bridge, no
# iptables: what works inside a sandbox or container), stopped again at the end, also on failure.
# When debian:12-slim can be neither found nor pulled (no registry), debootstrap makes it from
# Debian's packages and docker import names it so: the Dockerfile is built unchanged.
# The engine's data (the base image and the build's layers, the warm cache) lives outside the
# checkout in SLUICE_IMAGE_CACHE (default /var/cache/sluice-image), bounded by
# SLUICE_IMAGE_CACHE_GB (default 30; a build adds about 10 GB on vfs): above it, or with less
# than SLUICE_IMAGE_MIN_FREE_GB (20) free on its disk, the cache is pruned and the build is cold.
# HTTPS through an intercepting proxy: the build stage trusts SLUICE_BUILD_CA (default: this
# machine's /etc/ssl/certs/ca-certificates.crt; "none" for nothing), copied into docker/build-ca/
# for the build and removed after; it never reaches the runtime image.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=${SLUICE_IMAGE_CACHE:-/var/cache/sluice-image}
CACHE_BOUND_GB=${SLUICE_IMAGE_CACHE_GB:-30}
# The image measured 4,110 MB at e4b0847 (3.99 GB of it the /opt/sluice + /models layer: LibTorch
# and the wheel's CUDA, cuDNN, NCCL and cuSPARSELt libraries); the bound is that plus 10 %.
# NVIDIA's Triton images are over 10 GB.
SIZE_BOUND_MB=${SLUICE_IMAGE_SIZE_BOUND_MB:-4520}
BASE_IMAGE=debian:12-slim
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
PY=$ROOT/.venv/bin/python
log() { printf '[image-test] %s\n' "$*"; }
started=$(date +%s)

scripts/setup.sh  # this machine's side: tritonclient and torch for the checks

WORK=$(mktemp -d)
NAME=sluice-image-test-$$
OWN_DOCKERD=""
WHEEL_SERVER=""
cleanup() {
  local code=$?
  [ -z "$WHEEL_SERVER" ] || kill "$WHEEL_SERVER" 2>/dev/null || true
  if docker inspect "$NAME" >/dev/null 2>&1; then
    [ "$code" = 0 ] || { log "container log (last 60 lines):"; docker logs "$NAME" 2>&1 | tail -60; }
    docker rm -f "$NAME" >/dev/null 2>&1 || true
  fi
  rm -f docker/build-ca/build-host.crt
  rm -rf "$WORK"
  if [ -n "$OWN_DOCKERD" ]; then
    log "stopping the Docker engine this script started"
    $SUDO kill "$(cat "$CACHE/dockerd.pid")" 2>/dev/null || true
    for _ in $(seq 60); do [ -e "$CACHE/dockerd.pid" ] || break; sleep 0.5; done
  fi
  exit "$code"
}
trap cleanup EXIT

# Whether the engine in use is the one of $CACHE (started by this script, now or by an earlier run).
own_engine() { [ "${DOCKER_HOST:-}" = "unix://$CACHE/docker.sock" ]; }
free_gb() { local d=$1; [ -d "$d" ] || d=/; df --output=avail -BG "$d" | tail -1 | tr -dc 0-9; }
# make_room WHAT NEED_GB: with less than NEED_GB free on the engine's disk, drops what only the
# next build would use (the untagged images of this build's cached steps, the build stage's among
# them, and the wheels), then fails plainly if there is still too little, instead of a container
# dying half-made with "no space left on device". Only for the engine of $CACHE (this script's).
make_room() {
  own_engine || return 0
  local what=$1 need=$2 free
  free=$(free_gb "$CACHE")
  if [ "$free" -lt "$need" ]; then
    log "$free GB free, $what needs about $need GB: dropping the build cache (the next build is cold)"
    docker image prune -f >/dev/null || true
    $SUDO rm -rf "$CACHE/wheels"
    free=$(free_gb "$CACHE")
  fi
  log "disk: $free GB free on $CACHE's filesystem for $what (about $need GB needed)"
  [ "$free" -ge "$need" ] || { echo "too little disk for $what: $free GB free, about $need GB needed" >&2; exit 1; }
}

# ---- a Docker engine --------------------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
  missing=()
  for pkg in docker.io debootstrap; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    log "apt-get install ${missing[*]}"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
  export DOCKER_HOST=unix://$CACHE/docker.sock
  if ! docker info >/dev/null 2>&1; then
    log "starting dockerd (data root $CACHE/docker, vfs storage, host and none networks only)"
    $SUDO mkdir -p "$CACHE"
    # shellcheck disable=SC2086
    $SUDO sh -c "exec dockerd --storage-driver vfs --iptables=false --bridge=none \
        --data-root '$CACHE/docker' --exec-root '$CACHE/exec' --host '$DOCKER_HOST' \
        --pidfile '$CACHE/dockerd.pid' ${SLUICE_DOCKERD_ARGS:-} >'$CACHE/dockerd.log' 2>&1" &
    OWN_DOCKERD=1
    for _ in $(seq 120); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
    docker info >/dev/null 2>&1 || { tail -20 "$CACHE/dockerd.log" >&2; echo "dockerd did not start" >&2; exit 1; }
    $SUDO chmod 666 "$CACHE/docker.sock" 2>/dev/null || true
  fi
fi
docker ps -aq --filter name=sluice-image-test- | xargs -r docker rm -f >/dev/null
if own_engine; then
  # Our own engine: the build containers an interrupted build left hold gigabytes each.
  docker container prune -f >/dev/null
  # Layer folders that no image or container refers to: what a container whose creation ran out
  # of disk leaves behind (dockerd does not remove them), gigabytes each on vfs. Only with the
  # engine this run has just started, which is idle: a layer being made has its folder before
  # anything refers to it.
  layers=$CACHE/docker/vfs/dir
  if [ -n "$OWN_DOCKERD" ] && $SUDO test -d "$layers" && $SUDO test -d "$CACHE/docker/image/vfs/layerdb"; then
    known=$($SUDO find "$CACHE/docker/image/vfs/layerdb" \( -name cache-id -o -name mount-id -o -name init-id \) \
      -exec awk 1 {} +)
    for dir in $($SUDO ls "$layers"); do
      grep -qxF "$dir" <<<"$known" || { log "removing a layer folder nothing refers to: $dir"; $SUDO rm -rf "${layers:?}/$dir"; }
    done
  fi
  free=$(free_gb "$CACHE")
  if [ "$free" -lt "${SLUICE_IMAGE_MIN_FREE_GB:-20}" ]; then
    log "only $free GB free: pruning the image cache (this build is cold)"
    docker system prune -af >/dev/null
  fi
fi

# ---- the base image ---------------------------------------------------------------------------
if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 && ! timeout 120 docker pull -q "$BASE_IMAGE" 2>/dev/null; then
  log "no registry: making $BASE_IMAGE with debootstrap (Debian 12 minbase) and docker import"
  t0=$(date +%s)
  rootfs=$CACHE/rootfs
  $SUDO rm -rf "$rootfs"
  $SUDO debootstrap --variant=minbase bookworm "$rootfs" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" \
    >"$CACHE/debootstrap.log" 2>&1 || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
  $SUDO rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  $SUDO tar -C "$rootfs" -c . | docker import -c 'CMD ["bash"]' - "$BASE_IMAGE" >/dev/null
  $SUDO rm -rf "$rootfs"
  log "base image made in $(($(date +%s) - t0)) s"
fi

# ---- the build --------------------------------------------------------------------------------
# The build stage's pip takes the wheels from this machine (pip download fills $CACHE/wheels from
# pip's own cache, warm after scripts/setup.sh), served on loopback: the 3.5 GB of torch and its
# CUDA libraries cross the network once per machine, not once per image build.
WHEELS=$CACHE/wheels
$SUDO mkdir -p "$WHEELS" && $SUDO chown "$(id -u)" "$WHEELS"
t0=$(date +%s)
"$PY" -m pip download -q --disable-pip-version-check -r requirements.txt -r requirements-cuda.txt -d "$WHEELS"
# A fixed port when it is free: the URL is a build argument, part of the build step's cache key.
read -r WHEEL_PORT < <("$PY" -c '
import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])' "${SLUICE_WHEEL_PORT:-3141}")
"$PY" -m http.server --bind 127.0.0.1 --directory "$WHEELS" "$WHEEL_PORT" >/dev/null 2>&1 &
WHEEL_SERVER=$!
log "wheels for the build stage: $WHEELS ($(du -sh "$WHEELS" | cut -f1), $(($(date +%s) - t0)) s), served on 127.0.0.1:$WHEEL_PORT"

ca=${SLUICE_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}
if [ "$ca" != none ] && [ -f "$ca" ]; then cp "$ca" docker/build-ca/build-host.crt; fi
log "docker build (docker/build-image.sh; $(free_gb "$CACHE") GB free, a cold build takes about 25 GB on vfs)"
t0=$(date +%s)
DOCKER_BUILDKIT=0 docker/build-image.sh sluice -- --network host \
    --build-arg PIP_FIND_LINKS="http://127.0.0.1:$WHEEL_PORT/" 2>&1 | tee "$WORK/build.log" \
  | grep -E --line-buffered '^(Step |built |\[setup\] |packaged )' || true
[ "${PIPESTATUS[0]}" = 0 ] || { tail -40 "$WORK/build.log"; echo "the image build failed" >&2; exit 1; }
build_s=$(($(date +%s) - t0))
rm -f docker/build-ca/build-host.crt
kill "$WHEEL_SERVER" 2>/dev/null || true
WHEEL_SERVER=""
TAG=$(sed -n 's/^built //p' "$WORK/build.log" | tail -1)
steps=$(grep -c '^Step ' "$WORK/build.log" || true)
cached=$(grep -c 'Using cache' "$WORK/build.log" || true)
compile=$(grep -A1 '^Step .*scripts/build.sh' "$WORK/build.log" | grep -c 'Using cache' || true)
log "built $TAG in $build_s s ($cached of $steps steps from the cache; the compile step $([ "$compile" -gt 0 ] && echo cached: warm || echo ran: cold))"

size=$(docker image inspect -f '{{.Size}}' "$TAG")
size_mb=$((size / 1000000))
log "image size: $size_mb MB (bound $SIZE_BOUND_MB MB); largest layers:"
docker history --no-trunc --format '{{.Size}}\t{{.CreatedBy}}' "$TAG" | sort -h -r | head -4 | cut -c1-150 | sed 's/^/    /'

# ---- run it as users do -----------------------------------------------------------------------
read -r GRPC HTTP METRICS < <("$PY" -c '
import socket
sockets = [socket.socket() for _ in range(3)]
for s in sockets: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in sockets])')
make_room "a container (two copies of the image on vfs)" $((2 * size_mb / 1000 + 2))
log "docker run --read-only --tmpfs /tmp:exec --network host (gRPC $GRPC, HTTP $HTTP, metrics $METRICS)"
docker run -d --name "$NAME" --read-only --tmpfs /tmp:exec --network host -e SLUICE_HEALTH_PORT="$GRPC" "$TAG" \
  --grpc-port "$GRPC" --http-port "$HTTP" --metrics-port "$METRICS" >/dev/null
t0=$(date +%s)
docker cp -q "$NAME:/models" "$WORK/models"
"$PY" tests/image/check_image.py serve --grpc "127.0.0.1:$GRPC" --http "127.0.0.1:$HTTP" \
  --metrics "127.0.0.1:$METRICS" --models "$WORK/models" --container "$NAME"
log "ready and answering $(($(date +%s) - t0)) s after docker run"

health=""
for _ in $(seq 90); do
  health=$(docker inspect -f '{{.State.Health.Status}}' "$NAME")
  [ "$health" = healthy ] && break
  sleep 2
done
log "docker health: $health"
[ "$health" = healthy ] || { echo "the container never became healthy" >&2; exit 1; }

uid=$(stat -c %u "/proc/$(docker inspect -f '{{.State.Pid}}' "$NAME")")
log "the server runs as uid $uid"
[ "$uid" = 10001 ] || { echo "the server runs as uid $uid, not the image's 10001" >&2; exit 1; }

"$PY" tests/image/check_image.py drain --grpc "127.0.0.1:$GRPC" --container "$NAME"
docker logs "$NAME" 2>&1 | grep 'event=stopped' >/dev/null || { echo "the server's log has no event=stopped" >&2; exit 1; }
# One container at a time: on vfs each holds two full copies of the image (its init and rw layers).
docker rm "$NAME" >/dev/null

make_room "a container (two copies of the image on vfs)" $((2 * size_mb / 1000 + 2))
# (--print-env exits non-zero when no GPU is usable; 125 is docker's own: no container ran.)
rc=0; docker run --rm --network none "$TAG" --print-env >"$WORK/print-env.txt" 2>&1 || rc=$?
sed 's/^/    /' "$WORK/print-env.txt"
[ "$rc" != 125 ] || { echo "docker could not run the image for --print-env (above)" >&2; exit 1; }
grep -q '^gpus: none' "$WORK/print-env.txt" && grep -q '^result: no usable GPU' "$WORK/print-env.txt" \
  || { echo "--print-env in the image does not say that no GPU is visible" >&2; exit 1; }
grep -q '^operator library: /opt/sluice/lib/sluice/torchvision_ops.so (bundled torchvision): .* in torchvision$' \
  "$WORK/print-env.txt" || { echo "--print-env in the image does not list torchvision's operators" >&2; exit 1; }

if [ "$size_mb" -gt "$SIZE_BOUND_MB" ]; then
  echo "the image is $size_mb MB, above the $SIZE_BOUND_MB MB bound (SIZE_BOUND_MB in this script says why)" >&2
  exit 1
fi

# ---- keep the cache bounded -------------------------------------------------------------------
# Older tags go; the untagged images stay: they are this build's cached steps (the build stage's
# among them), what makes the next build of unchanged sources warm. Above the bound, all go.
docker images --format '{{.Repository}}:{{.Tag}}' sluice | grep -vxF "$TAG" | xargs -r docker rmi >/dev/null || true
used_gb=$($SUDO du -sx --block-size=1G "$CACHE" 2>/dev/null | cut -f1 || echo 0)
if [ "$used_gb" -gt "$CACHE_BOUND_GB" ]; then
  log "the cache holds $used_gb GB, above $CACHE_BOUND_GB GB: pruning everything (the next run is cold)"
  docker system prune -af >/dev/null || true
  used_gb=$($SUDO du -sx --block-size=1G "$CACHE" | cut -f1)
fi
log "passed in $(($(date +%s) - started)) s (build $build_s s); cache $CACHE holds $used_gb GB"
