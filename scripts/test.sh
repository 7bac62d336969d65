#!/usr/bin/env bash
# The test command: installs what is missing, builds with warnings as errors, runs every test
# (unit, integration, GPU tests that skip without a GPU), then the scheduler tests again under
# ThreadSanitizer. Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
scripts/build.sh -DSLUICE_WERROR=ON
(cd build && ctest --output-on-failure -j "${SLUICE_TEST_JOBS:-2}" --timeout 900)

# The scheduling code has no torch in it, so a ThreadSanitizer build of its tests is cheap: only
# those targets are built in build-tsan.
SLUICE_BUILD_DIR=build-tsan SLUICE_BUILD_TARGETS="scheduler_test manager_test" \
  scripts/build.sh -DSLUICE_WERROR=ON -DSLUICE_SANITIZE=thread >/dev/null
for test in scheduler_test manager_test; do
  echo "== ThreadSanitizer: $test"
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" build-tsan/bin/$test --gtest_brief=1
done
