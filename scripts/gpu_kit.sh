#!/usr/bin/env bash
# The GPU proof kit: everything a GPU machine without apt, PyPI or our build needs to prove the
# whole GPU path in one command (see docs/guide/gpu.md, "GPU check").
#
#   scripts/gpu_kit.sh build     stage build/gpu-kit from a finished build (scripts/build.sh):
#                                stripped binaries (libexec/, RUNPATH $ORIGIN/../lib), the
#                                non-torch shared libraries they load, perf_analyzer, Python
#                                wheels, the step scripts and run.sh
#   scripts/gpu_kit.sh selftest  build, then run the kit here from a copy under `env -i` with
#                                --no-gpu and this machine's torch standing in for the GPU
#                                machine's: every step that can runs, the GPU steps report
#                                `skipped: no GPU`, and every carried binary must resolve its
#                                libraries into the kit, the torch lib dir or glibc; then run.sh
#                                on fake steps with a small budget: a step whose cap does not fit
#                                must read `skipped: budget`, one over its cap `fail`, one
#                                without a result `fail`, the `# kit-always` step must run
#
# On the GPU machine: build/gpu-kit/run.sh (it prints where the report goes; $OUT when set).
# The payload must stay under 60 MiB (the GPU machine takes 64 MiB with the working tree).
# Never carried: the driver's libraries (libcuda, libnvidia-*), anything of the torch wheel or
# the nvidia/* wheels (the GPU machine's own torch provides them), glibc, libstdc++, libgcc_s.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_DIR=${SLUICE_BUILD_DIR:-build}
KIT=$(realpath -m "$BUILD_DIR/gpu-kit")
PY=$ROOT/.venv/bin/python
LIMIT_MIB=60
WHEEL_CACHE=$ROOT/.cache/gpu-kit-wheels

log() { printf '[gpu-kit] %s\n' "$*"; }
die() { printf '[gpu-kit] error: %s\n' "$*" >&2; exit 1; }

# Wheels the GPU machine's python 3.12 may lack, each with the version range our checks need;
# run.sh installs one only where the machine's own copy is missing or out of that range.
# name==version  pip platform options  required range (written to wheels/requirements.txt)
WHEELS=(
  "tritonclient==2.73.0|--platform any|>=2.73.0"
  "python-rapidjson==1.25|--platform manylinux_2_28_x86_64|>=0.9.1"
  "protobuf==6.33.6|--platform manylinux2014_x86_64|>=6.30.0,<7"
  "grpcio==1.85.3|--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64|>=1.81.1"
  # tritonclient imports it (BF16) at import time; a bare torch machine may lack it.
  "ml_dtypes==0.5.4|--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64|>=0.4"
)

# torch's lib dir and the nvidia/* wheels' lib dirs, as run.sh puts them on LD_LIBRARY_PATH.
torch_libs() {
  "$PY" -c 'import glob, os, torch; site = os.path.dirname(os.path.dirname(torch.__file__)); print(":".join([os.path.join(site, "torch", "lib")] + sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib")))))'
}

build_kit() {
  local bin=$BUILD_DIR/bin
  local binaries=(sluice-server sluice-client sluice-bench-inprocess sluice-bench-echo sluice-bench-load
                  torch_backend_gpu_test)
  for b in "${binaries[@]}"; do
    [ -x "$bin/$b" ] || die "no $bin/$b: run scripts/build.sh first"
  done
  local pa=$ROOT/.venv/opt/perf_analyzer
  [ -x "$pa/perf_analyzer" ] || die "no perf_analyzer in .venv/opt: run scripts/setup.sh first"
  command -v patchelf >/dev/null || die "patchelf is missing: run scripts/setup.sh"

  rm -rf "$KIT"
  mkdir -p "$KIT"/{libexec,lib,wheels,src/tests,src/models,src/benchmarks}
  for b in "${binaries[@]}"; do
    strip --strip-unneeded -o "$KIT/libexec/$b" "$bin/$b"
  done
  strip --strip-unneeded -o "$KIT/libexec/perf_analyzer" "$pa/perf_analyzer"
  cp "$pa/lib/libcudart.so.12" "$KIT/lib/"  # perf_analyzer's CUDA 12 runtime (torch has 13)
  # Build-tree RUNPATHs point into this machine's .venv: replace them so that, here as there,
  # only the kit (and the LD_LIBRARY_PATH of run.sh's per-binary wrappers: the kit, then the
  # machine's torch) is searched.
  for f in "$KIT"/libexec/*; do patchelf --set-rpath '$ORIGIN/../lib' "$f"; done

  # The shared libraries the binaries load, resolved here with the torch wheel's lib dir first
  # (so that everything the torch wheel provides is recognised as such and left out).
  local tlib site
  tlib=$(torch_libs)
  site=$(dirname "$(dirname "${tlib%%:*}")")
  for f in "$KIT"/libexec/*; do
    LD_LIBRARY_PATH="$KIT/lib:$tlib" ldd "$f"
  done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u | while read -r soname path; do
    case "$path" in "$site"/*|"$KIT"/*) continue ;; esac
    case "$soname" in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libutil.so.*|ld-linux*|libresolv.so.*) continue ;;
      libstdc++.so.*|libgcc_s.so.*) continue ;;
      libcuda.so*|libnvidia-*) continue ;;
    esac
    cp -L "$path" "$KIT/lib/$soname"
  done
  for f in "$KIT"/lib/*; do strip --strip-unneeded "$f" 2>/dev/null || true; done
  # perf_analyzer, the kit's largest file (14 MB stripped), travels xz-compressed as well once its
  # libraries are resolved (run.sh unpacks libexec/*.xz before it writes the wrappers).
  xz -9 -T1 "$KIT/libexec/perf_analyzer"
  # torchvision's operators, where the server looks for them (libexec/../lib/sluice), compressed
  # (7.8 MB -> 1.1 MB): run.sh unpacks them.
  if [ -f "$BUILD_DIR/lib/sluice/torchvision_ops.so" ]; then
    mkdir -p "$KIT/lib/sluice"
    strip --strip-unneeded -o "$KIT/lib/sluice/torchvision_ops.so" "$BUILD_DIR/lib/sluice/torchvision_ops.so"
    xz -9 "$KIT/lib/sluice/torchvision_ops.so"
  fi

  # Wheels for the Python checks, cached between builds.
  mkdir -p "$WHEEL_CACHE"
  : >"$KIT/wheels/requirements.txt"
  local entry spec opts range name
  for entry in "${WHEELS[@]}"; do
    IFS='|' read -r spec opts range <<<"$entry"
    name=${spec%%==*}
    # shellcheck disable=SC2086
    "$ROOT/.venv/bin/pip" download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --python-version 3.12 --implementation cp $opts -d "$WHEEL_CACHE" "$spec" \
      || die "pip could not fetch the wheel $spec"
    local file
    file=$(cd "$WHEEL_CACHE" && ls -t -- "$(echo "$name" | tr - _)"-"${spec##*==}"-*.whl | head -1)
    cp "$WHEEL_CACHE/$file" "$KIT/wheels/"
    echo "$name $range $file" >>"$KIT/wheels/requirements.txt"
  done

  # What the steps import: the integration test helpers (and the GPU tests themselves), the floor
  # benchmark's load driver and the modules it imports, and the bundled models' configs and
  # generator.
  cp -r tests/integration tests/harness "$KIT/src/tests/"
  cp benchmarks/floor_benchmark.py benchmarks/batching_benchmark.py benchmarks/request_path_benchmark.py \
    benchmarks/latency_target_benchmark.py benchmarks/on_demand_benchmark.py \
    "$KIT/src/benchmarks/"
  find "$KIT/src" -name __pycache__ -prune -exec rm -rf {} +
  cp models/generate_models.py models/bundled_models.py models/model_cache.py models/sluice_export.py "$KIT/src/models/"
  for config in models/*/config.pbtxt; do
    mkdir -p "$KIT/src/models/$(basename "$(dirname "$config")")"
    cp "$config" "$KIT/src/models/$(basename "$(dirname "$config")")/"
  done
  cp -r scripts/gpu_kit/. "$KIT/"
  # The server's protos as a descriptor set, where the latency-target benchmark reads Sluice's own
  # statistics fields (bin/../proto, as in a build folder).
  mkdir -p "$KIT/proto"
  cp "$BUILD_DIR/proto/sluice_protos.desc" "$KIT/proto/"
  chmod +x "$KIT/run.sh"

  local glibc
  glibc=$(find "$KIT/libexec" "$KIT/lib" -type f | while read -r f; do objdump -T "$f" 2>/dev/null || true; done \
    | grep -o 'GLIBC_[0-9.]*' | sort -t. -k1,1 -k2,2n -k3,3n -u | tail -1)
  "$PY" - "$KIT/MANIFEST.json" "$glibc" <<'EOF'
import json, subprocess, sys, datetime, torch
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
dirty = bool(subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True).stdout.strip())
json.dump({"commit": commit + ("-dirty" if dirty else ""),
           "built": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "torch": torch.__version__, "cuda": torch.version.cuda,
           "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI), "glibc_needed": sys.argv[2]},
          open(sys.argv[1], "w"), indent=2)
EOF

  local bytes mib
  bytes=$(du -sb "$KIT" | cut -f1)
  mib=$(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}')
  log "staged $KIT: $mib MiB (limit $LIMIT_MIB MiB), needs $glibc or newer"
  (cd "$KIT" && du -sb libexec lib wheels src | awk '{printf "[gpu-kit]   %-7s %6.1f MiB\n", $2, $1 / 1048576}')
  awk -v b="$bytes" -v l="$LIMIT_MIB" 'BEGIN {exit !(b <= l * 1048576)}' \
    || die "the kit is $mib MiB, over the $LIMIT_MIB MiB limit"
}

selftest() {
  build_kit
  local tmp
  tmp=$(mktemp -d /tmp/sluice-gpu-kit-selftest.XXXXXX)
  trap 'rm -rf "$tmp"' RETURN
  cp -a "$KIT" "$tmp/kit"
  # The .pt2 step's dry run serves the CPU package the tests compiled (about a minute to compile).
  if [ -d "$ROOT/.cache/aoti" ]; then mkdir -p "$tmp/kit/src/.cache" && cp -r "$ROOT/.cache/aoti" "$tmp/kit/src/.cache/"; fi
  # The wheels must install into a python 3.12 (what the GPU machine has), not just this one.
  "$ROOT/.venv/bin/pip" install -q --disable-pip-version-check --dry-run --no-index --no-deps \
    --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
    --target "$tmp/site" "$tmp"/kit/wheels/*.whl \
    || die "the kit's wheels do not install for python 3.12"
  log "running the kit from $tmp/kit with --no-gpu under env -i"
  local rc=0
  env -i HOME="$tmp" PATH=/usr/bin:/bin LANG=C.UTF-8 \
    "$tmp/kit/run.sh" --no-gpu --python "$PY" --out "$tmp/out" || rc=$?
  [ "$rc" -eq 0 ] || die "run.sh --no-gpu exited $rc"
  "$PY" "$ROOT/scripts/gpu_kit/check_report.py" --no-gpu "$tmp/out"
  budget_selftest "$tmp"
}

# run.sh's budget logic on fake steps: with a 40 s budget and a 10 s always-step held back,
# 01 (cap 5) runs, 02 (cap 60) cannot fit and is `skipped: budget`, 03 overruns its 2 s cap and
# fails, 04 writes no result and fails, 05 (cap 5) still fits and runs, 99 (kit-always) runs.
budget_selftest() {
  local tmp=$1 steps=$1/fake-steps
  mkdir -p "$steps"
  local ok='printf "{\"status\": \"pass\", \"summary\": \"ran\"}" >"$STEP_DIR/result.json"'
  printf '# kit-timeout: 5\n%s\n' "$ok" >"$steps/01_quick.sh"
  printf '# kit-timeout: 60\nsleep 50\n%s\n' "$ok" >"$steps/02_slow.sh"
  printf '# kit-timeout: 2\nsleep 30\n%s\n' "$ok" >"$steps/03_overrun.sh"
  printf '# kit-timeout: 5\nexit 0\n' >"$steps/04_no_result.sh"
  printf '# kit-timeout: 5\n%s\n' "$ok" >"$steps/05_after.sh"
  printf '# kit-timeout: 10\n# kit-always\n%s\n' "$ok" >"$steps/99_always.sh"
  log "budget self-test: fake steps with --budget 40"
  env -i HOME="$tmp" PATH=/usr/bin:/bin LANG=C.UTF-8 \
    "$tmp/kit/run.sh" --no-gpu --python "$PY" --out "$tmp/budget-out" --steps "$steps" --budget 40 >"$tmp/budget.log" 2>&1 \
    || { cat "$tmp/budget.log"; die "run.sh on the fake steps exited non-zero"; }
  "$PY" "$ROOT/scripts/gpu_kit/check_report.py" --steps "$steps" \
    --expect "01_quick=pass" --expect "02_slow=skipped:skipped: budget" --expect "03_overrun=fail:timed out" \
    --expect "04_no_result=fail:exited 0 without a result" --expect "05_after=pass" --expect "99_always=pass" \
    "$tmp/budget-out" || { cat "$tmp/budget.log"; die "run.sh's budget logic is wrong"; }
}

case "${1:-}" in
  build) build_kit ;;
  selftest) selftest ;;
  *) echo "usage: scripts/gpu_kit.sh build|selftest" >&2; exit 2 ;;
esac
