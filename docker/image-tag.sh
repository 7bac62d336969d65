#!/usr/bin/env bash
# Prints the image tag for a package's VERSIONS file (written by scripts/package.sh):
#   <repository>:<sluice>-torch<torch>-cuda<cuda>-cudnn<cudnn>, e.g.
#   sluice:0.1.0-torch2.11.0-cuda13.0-cudnn9.19.0
# Usage: docker/image-tag.sh VERSIONS [REPOSITORY]   (REPOSITORY defaults to "sluice")
set -euo pipefail
versions=${1:?usage: docker/image-tag.sh VERSIONS [REPOSITORY]}
repository=${2:-sluice}
value() {
  local v
  v=$(sed -n "s/^$1=//p" "$versions")
  [ -n "$v" ] || { echo "$versions has no $1=" >&2; exit 1; }
  printf '%s' "$v"
}
sluice=$(value sluice)
torch=$(value torch)
cuda=$(value cuda)
cudnn=$(value cudnn)
echo "${repository}:${sluice}-torch${torch}-cuda${cuda}-cudnn${cudnn}"
