#!/usr/bin/env bash
# Compiles every library of server/ (and sluice-server's main) with clang and
# -Wthread-safety -Werror: each ABSL_GUARDED_BY member is read and written only with its mutex
# held, and each ABSL_EXCLUSIVE_LOCKS_REQUIRED function is called with it (server/core/mutex.h
# explains the annotated Mutex these rely on). Objects only, no linking, in the clang build
# (scripts/build_clang.sh: build-clang, which scripts/fuzz.sh then links its targets from);
# ccache makes a rerun cheap. Exits non-zero on the first violation.
set -euo pipefail
cd "$(dirname "$0")/.."

targets="sluice_core sluice_repository sluice_batching sluice_manager sluice_frontend sluice_grpc sluice_http sluice_metrics sluice_runtime
         sluice_server_flags sluice_server"
mkdir -p build-clang
log=build-clang/thread_safety.log
# shellcheck disable=SC2086  # one target per word
if ! scripts/build_clang.sh $targets >"$log" 2>&1; then
  grep -E -A4 "error:|FAILED" "$log" | head -n 80
  echo "clang -Wthread-safety found problems (whole log: $log)" >&2
  exit 1
fi
echo "clang -Wthread-safety: server/ clean"
