#!/usr/bin/env bash
# Builds the container image (docker/Dockerfile) and tags it with the line-up it really holds,
# read back from the image's /opt/sluice/VERSIONS:
#   sluice:<version>-torch<X>-cuda<Y>-cudnn<Z>
# Usage (from anywhere): docker/build-image.sh [REPOSITORY] [-- extra docker build arguments]
#   docker/build-image.sh                      -> sluice:0.1.0-torch2.11.0-cuda13.0-cudnn9.19.0
#   docker/build-image.sh registry.example.com/ml/sluice -- --build-arg CUDA_VERSION=13.0.2
set -euo pipefail
cd "$(dirname "$0")/.."
repository=${1:-sluice}
shift || true
[ "${1:-}" = "--" ] && shift
scratch="${repository}:build-$$"
docker build -f docker/Dockerfile -t "$scratch" "$@" .
versions=$(mktemp)
trap 'rm -f "$versions"' EXIT
docker run --rm --network none --entrypoint cat "$scratch" /opt/sluice/VERSIONS >"$versions"
tag=$(docker/image-tag.sh "$versions" "$repository")
docker tag "$scratch" "$tag"
docker rmi "$scratch" >/dev/null
echo "built $tag"
