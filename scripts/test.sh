#!/usr/bin/env bash
# The test command: installs what is missing, builds with clang, warnings as errors and clang's
# -Wthread-safety, runs every test (unit, integration, GPU tests that skip without a GPU) and the
# GPU proof kit's self-test. Meanwhile, in the background from the moment the distribution
# packages are there: the scheduler, manager and tracing tests under ThreadSanitizer and 10 s of each
# libFuzzer target (scripts/test_sanitizers.sh; they need no LibTorch).
# Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each stage's time, printed at the end (and as it goes): where the test command's minutes go.
times=()
mark=$SECONDS
stage() { times+=("$1 $((SECONDS - mark)) s"); mark=$SECONDS; echo "== took ${times[-1]}"; }

scripts/setup.sh --system
# The sanitizer stages run beside pip's install of torch and the main build, in a session of their
# own so that a failure here stops them too. pip leaves less of a core idle than it seems (setup
# took 232 s beside them against 136 s alone): the overlap saved about 30 s at ac5b1b6. Waited
# for before ctest: the integration tests get the machine to themselves.
sanitizers_log=$(mktemp /tmp/sluice-test-sanitizers.XXXXXX)
SLUICE_BUILD_JOBS=1 setsid --wait scripts/test_sanitizers.sh "${SLUICE_FUZZ_SECONDS:-10}" >"$sanitizers_log" 2>&1 &
sanitizers=$!
trap '[ -z "$sanitizers" ] || kill -- -"$sanitizers" 2>/dev/null || true; echo "== stage times: ${times[*]:-none}"' EXIT

scripts/setup.sh
stage setup
# Every lock's data is declared (ABSL_GUARDED_BY) and clang checks it as it compiles:
# SLUICE_THREAD_SAFETY=ON refuses to configure with a compiler that cannot.
scripts/build.sh -DSLUICE_WERROR=ON -DSLUICE_THREAD_SAFETY=ON
stage build

status=0
wait "$sanitizers" || status=$?
sanitizers=""
grep -E "^== |stat::number_of_executed_units" "$sanitizers_log" || true
if [ "$status" -ne 0 ]; then
  tail -n 80 "$sanitizers_log"
  echo "the sanitizer stages failed (exit $status; whole log: $sanitizers_log)" >&2
  exit "$status"
fi
rm -f "$sanitizers_log"
stage "sanitizers (the wait for them after the build)"

(cd build && ctest --output-on-failure -j "${SLUICE_TEST_JOBS:-2}" --timeout 900)
stage ctest

# The GPU proof kit must not rot: stage it, run it from a copy under env -i with --no-gpu (every
# step's logic runs on the CPU, GPU steps report skipped), check sizes and library resolution.
echo "== GPU proof kit self-test"
scripts/gpu_kit.sh selftest
stage gpu-kit
