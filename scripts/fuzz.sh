#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz in their own clang build, build-fuzz (our code with
# AddressSanitizer, UndefinedBehaviorSanitizer and libFuzzer's coverage instrumentation, asserts
# on; the targets link no LibTorch), and runs each for SECONDS (default 30) from its committed
# seed corpus (tests/fuzz/corpus/<name>; new inputs go to build-fuzz/corpus/<name>, the seeds stay as
# they are). A crash, a sanitizer report, a leak, a single allocation over 1 GiB or an input that
# runs over 10 s fails the run and leaves the input in build-fuzz/.
#   scripts/fuzz.sh                           # what the test command runs (10 s each)
#   SLUICE_FUZZ_OPT=-O1 scripts/fuzz.sh 3600  # a long run: twice the inputs per second
# -O0 by default: the test command compiles what the targets link (about two minutes on 2 cores,
# against three and a half at -O1) and fuzzes for seconds only. Changing SLUICE_FUZZ_OPT
# rebuilds build-fuzz.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}

out=build-fuzz
targets="fuzz_infer_request fuzz_model_config fuzz_http_request fuzz_http_framing"
mkdir -p "$out"
if ! CC=clang CXX=clang++ SLUICE_BUILD_DIR=$out SLUICE_BUILD_TARGETS="$targets" \
     scripts/build.sh -DSLUICE_TORCH=OFF -DSLUICE_WERROR=ON -DSLUICE_FUZZ=ON -DSLUICE_SANITIZE=address,undefined \
     -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=${SLUICE_FUZZ_OPT:--O0} -gline-tables-only" \
     -DCMAKE_CXX_FLAGS=-fno-sanitize-recover=all >"$out/build.log" 2>&1; then
  grep -E -A4 "error:|FAILED" "$out/build.log" | head -n 80
  echo "building the fuzz targets failed (whole log: $out/build.log)" >&2
  exit 1
fi

for target in $targets; do
  corpus=${target#fuzz_}
  mkdir -p "$out/corpus/$corpus"
  log="$out/$target.log"
  echo "== libFuzzer: $target for ${seconds}s"
  status=0
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$out/bin/$target" -max_total_time="$seconds" -print_final_stats=1 -timeout=10 \
    -rss_limit_mb=2048 -malloc_limit_mb=1024 -artifact_prefix="$out/$target-" \
    "$out/corpus/$corpus" "tests/fuzz/corpus/$corpus" >"$log" 2>&1 || status=$?
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb|stat::new_units_added" "$log" || true
  if [ "$status" -ne 0 ]; then
    tail -n 60 "$log"
    echo "$target failed (exit $status); the input is in $out/" >&2
    exit "$status"
  fi
done
