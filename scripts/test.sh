#!/usr/bin/env bash
# The test command: installs what is missing, builds with warnings as errors, runs every test
# (unit, integration, GPU tests that skip without a GPU), then the scheduler and manager tests
# again under ThreadSanitizer, then server/ through clang's -Wthread-safety, then the GPU proof
# kit's self-test, then 15 s of each libFuzzer target.
# Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each stage's time, printed at the end (and as it goes): where the test command's minutes go.
times=()
mark=$SECONDS
stage() { times+=("$1 $((SECONDS - mark)) s"); mark=$SECONDS; echo "== took ${times[-1]}"; }
trap 'echo "== stage times: ${times[*]:-none}"' EXIT

scripts/setup.sh
stage setup
scripts/build.sh -DSLUICE_WERROR=ON
stage build
(cd build && ctest --output-on-failure -j "${SLUICE_TEST_JOBS:-2}" --timeout 900)
stage ctest

# The batching and manager code has no torch and no protobuf in it, so a ThreadSanitizer build of
# their tests (queue, batcher, instance pool, stress test; the model table, loader and control
# thread; the clocks) is cheap: only those targets are built in build-tsan. Tests that parse configs stay
# out: Debian's libprotobuf is not instrumented, and protobuf's inline code changes under
# -fsanitize=thread, so mixing the two crashes in map fields.
# -O1 with line tables (ThreadSanitizer's reports name files and lines; -O2 -g costs about twice
# the compile time for nothing it finds).
SLUICE_BUILD_DIR=build-tsan SLUICE_BUILD_TARGETS="scheduler_test manager_test core_test" \
  scripts/build.sh -DSLUICE_WERROR=ON -DSLUICE_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug \
  "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g1" >/dev/null
# The batcher stress test sends 500 requests from each of its 64 threads here (32,000; 1,000 each
# in the plain run): under ThreadSanitizer its cost grows faster than the count (about 19 s at
# 500, 108 s at 1,000 on 2 cores) while the interleavings it exercises do not.
for suite in scheduler_test manager_test core_test; do
  echo "== ThreadSanitizer: $suite"
  SLUICE_STRESS_REQUESTS=500 \
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/sanitizers/tsan.supp" \
    "build-tsan/bin/$suite" --gtest_brief=1
done
stage tsan

# Every lock's data is declared (ABSL_GUARDED_BY) and clang checks it at compile time. This
# compiles server/ in build-clang (scripts/build_clang.sh), which the fuzz stage below links its
# targets from: each file is compiled with clang once.
echo "== clang -Wthread-safety"
scripts/thread_safety.sh
stage thread-safety

# The GPU proof kit must not rot: stage it, run it from a copy under env -i with --no-gpu (every
# step's logic runs on the CPU, GPU steps report skipped), check sizes and library resolution.
echo "== GPU proof kit self-test"
scripts/gpu_kit.sh selftest
stage gpu-kit

# Fuzzing, bounded: request decoding (gRPC messages, HTTP JSON and binary bodies), validation and
# padding; config.pbtxt parsing.
scripts/fuzz.sh "${SLUICE_FUZZ_SECONDS:-10}"
stage fuzz
