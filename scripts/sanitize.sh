#!/usr/bin/env bash
# Every suite (unit, integration, benchmark smoke runs; GPU tests skip without a GPU) on an
# AddressSanitizer + UndefinedBehaviorSanitizer build: CMake preset "asan", in build-asan.
# Our code (server, client, tests) is instrumented; LibTorch, gRPC, protobuf and the CUDA
# libraries are not, so ASan sees their heap through its malloc but not their own bugs. The
# suppressions that this needs are in tests/sanitizers/ with the reason for each.
# Takes about 18 minutes on 2 cores from a cold cache (13 to build, 4.5 to test), which would
# push CI past 30 minutes, so it is not in the test command: run it before a release
# and after changes to memory handling. Extra arguments go to ctest (e.g. -R ModelControl).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || scripts/setup.sh
SLUICE_BUILD_DIR=build-asan scripts/build.sh --preset asan
ctest --preset asan "$@"
