#!/usr/bin/env bash
# The one clang build of the test command, in build-clang: -Wthread-safety -Werror,
# AddressSanitizer, UndefinedBehaviorSanitizer and libFuzzer's coverage instrumentation on all of
# our code, at -O0 (SLUICE_CLANG_OPT) with line tables, asserts on. scripts/thread_safety.sh compiles server/'s
# libraries in it (objects only) and scripts/fuzz.sh links the libFuzzer targets from the same
# objects, so the test command compiles each file with clang once.
#   scripts/build_clang.sh TARGET...
# -O0 because the test command compiles every file of server/ here and fuzzes for seconds only:
# about 155 s for the thread-safety targets against 262 s at -O1, for half the inputs per second.
# For a long fuzzing run, SLUICE_CLANG_OPT=-O1 scripts/fuzz.sh 3600 (a full rebuild of build-clang).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$#" -gt 0 ] || { echo "usage: scripts/build_clang.sh TARGET..." >&2; exit 2; }
CC=clang CXX=clang++ SLUICE_BUILD_DIR=build-clang SLUICE_BUILD_TARGETS="$*" \
  scripts/build.sh -DSLUICE_WERROR=ON -DSLUICE_THREAD_SAFETY=ON -DSLUICE_FUZZ=ON \
  -DSLUICE_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug \
  "-DCMAKE_CXX_FLAGS_DEBUG=${SLUICE_CLANG_OPT:--O0} -gline-tables-only" -DCMAKE_CXX_FLAGS=-fno-sanitize-recover=all
