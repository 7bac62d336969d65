#!/usr/bin/env bash
# The test command's sanitizer stages, which need no LibTorch (built with -DSLUICE_TORCH=OFF, from
# Debian's packages alone): the scheduler, manager and clock tests under ThreadSanitizer, then
# each libFuzzer target for SECONDS (default 10) under AddressSanitizer and UBSan
# (scripts/fuzz.sh). scripts/test.sh runs this in the background while scripts/setup.sh installs
# torch and the main build compiles (see the timing there).
#   scripts/test_sanitizers.sh [SECONDS]
# Prints each part's time; exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
mark=$SECONDS

# The batching and manager code has no torch and no protobuf in it, so a ThreadSanitizer build of
# their tests (queue, batcher, instance pool, stress test; the model table, loader and control
# thread; the clocks; the tracer and the span exporter's thread) is cheap: only those targets are
# built in build-tsan. Tests that parse configs stay out: Debian's libprotobuf is not
# instrumented, and protobuf's inline code changes under -fsanitize=thread, so mixing the two
# crashes in map fields (the OTLP messages the exporter encodes have none).
# -O1 with line tables (ThreadSanitizer's reports name files and lines; -O2 -g costs about twice
# the compile time for nothing it finds).
# The suppressions (tests/sanitizers/tsan.supp) match function and file names: without a
# symbolizer every frame is "<null>", nothing matches, and a report they cover fails the run.
symbolizer=$(command -v llvm-symbolizer || true)
[ -n "$symbolizer" ] || { echo "no llvm-symbolizer on the PATH (Debian's llvm package; scripts/setup.sh installs it)" >&2; exit 1; }
echo "== ThreadSanitizer build"
SLUICE_BUILD_DIR=build-tsan SLUICE_BUILD_TARGETS="scheduler_test manager_test core_test tracing_test" \
  scripts/build.sh -DSLUICE_TORCH=OFF -DSLUICE_WERROR=ON -DSLUICE_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug \
  "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g1" >/dev/null
# The batcher stress test sends 500 requests from each of its 64 threads here (32,000; 1,000 each
# in the plain run): under ThreadSanitizer its cost grows faster than the count (about 19 s at
# 500, 108 s at 1,000 on 2 cores) while the interleavings it exercises do not.
for suite in scheduler_test manager_test core_test tracing_test; do
  echo "== ThreadSanitizer: $suite"
  SLUICE_STRESS_REQUESTS=500 \
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 external_symbolizer_path=$symbolizer suppressions=$PWD/tests/sanitizers/tsan.supp" \
    "build-tsan/bin/$suite" --gtest_brief=1
done
echo "== ThreadSanitizer took $((SECONDS - mark)) s"
mark=$SECONDS

# Fuzzing, bounded: request decoding (gRPC messages, HTTP JSON and binary bodies), validation and
# padding; config.pbtxt parsing. Its own build (build-fuzz: ASan, UBSan, coverage).
scripts/fuzz.sh "$seconds"
echo "== fuzzing took $((SECONDS - mark)) s"
