#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang; AddressSanitizer and UndefinedBehaviorSanitizer,
# coverage-guided; no LibTorch) into build-fuzz and runs each for SECONDS (default 30) from its
# committed seed corpus (tests/fuzz/corpus/<target>; new inputs go to build-fuzz/corpus, the seeds
# stay as they are). A crash, a sanitizer report, a leak, a single allocation over 1 GiB or an
# input that runs over 10 s fails the run and leaves the input in build-fuzz/.
#   scripts/fuzz.sh          # what the test command runs
#   scripts/fuzz.sh 3600     # a longer run
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}

CC=clang CXX=clang++ SLUICE_BUILD_DIR=build-fuzz \
  SLUICE_BUILD_TARGETS="fuzz_infer_request fuzz_model_config fuzz_http_request" \
  scripts/build.sh -DSLUICE_WERROR=ON -DSLUICE_FUZZ=ON -DSLUICE_SANITIZE=address,undefined \
  -DCMAKE_CXX_FLAGS=-fno-sanitize-recover=all >/dev/null

for target in infer_request model_config http_request; do
  mkdir -p "build-fuzz/corpus/$target"
  log="build-fuzz/fuzz_$target.log"
  echo "== libFuzzer: fuzz_$target for ${seconds}s"
  status=0
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "build-fuzz/bin/fuzz_$target" -max_total_time="$seconds" -print_final_stats=1 -timeout=10 \
    -rss_limit_mb=2048 -malloc_limit_mb=1024 -artifact_prefix="build-fuzz/fuzz_$target-" \
    "build-fuzz/corpus/$target" "tests/fuzz/corpus/$target" >"$log" 2>&1 || status=$?
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb|stat::new_units_added" "$log" || true
  if [ "$status" -ne 0 ]; then
    tail -n 60 "$log"
    echo "fuzz_$target failed (exit $status); the input is in build-fuzz/" >&2
    exit "$status"
  fi
done
