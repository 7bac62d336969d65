#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang; AddressSanitizer and UndefinedBehaviorSanitizer,
# coverage-guided; no LibTorch) in the clang build (scripts/build_clang.sh: build-clang, shared with
# scripts/thread_safety.sh) and runs each for SECONDS (default 30) from its committed seed corpus
# (tests/fuzz/corpus/<target>; new inputs go to build-clang/corpus, the seeds stay as they are).
# A crash, a sanitizer report, a leak, a single allocation over 1 GiB or an input that runs over
# 10 s fails the run and leaves the input in build-clang/.
#   scripts/fuzz.sh          # what the test command runs
#   scripts/fuzz.sh 3600     # a longer run
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}

out=build-clang
mkdir -p "$out"
if ! scripts/build_clang.sh fuzz_infer_request fuzz_model_config fuzz_http_request >"$out/fuzz_build.log" 2>&1; then
  grep -E -A4 "error:|FAILED" "$out/fuzz_build.log" | head -n 80
  echo "building the fuzz targets failed (whole log: $out/fuzz_build.log)" >&2
  exit 1
fi

for target in infer_request model_config http_request; do
  mkdir -p "$out/corpus/$target"
  log="$out/fuzz_$target.log"
  echo "== libFuzzer: fuzz_$target for ${seconds}s"
  status=0
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$out/bin/fuzz_$target" -max_total_time="$seconds" -print_final_stats=1 -timeout=10 \
    -rss_limit_mb=2048 -malloc_limit_mb=1024 -artifact_prefix="$out/fuzz_$target-" \
    "$out/corpus/$target" "tests/fuzz/corpus/$target" >"$log" 2>&1 || status=$?
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb|stat::new_units_added" "$log" || true
  if [ "$status" -ne 0 ]; then
    tail -n 60 "$log"
    echo "fuzz_$target failed (exit $status); the input is in $out/" >&2
    exit "$status"
  fi
done
