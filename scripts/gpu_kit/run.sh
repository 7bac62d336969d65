#!/usr/bin/env bash
# The GPU proof kit's runner (staged into build/gpu-kit by scripts/gpu_kit.sh build).
#
#   run.sh [--no-gpu] [--python PY] [--out DIR] [--budget SECONDS] [--only NAME[,NAME...]]
#          [--steps DIR]
#
# Runs every step under steps/ in name order, each under its own time cap (a `# kit-timeout: N`
# line in the step, default 60), all of them within --budget seconds (default 480: one 10-minute
# device command with room for the machine's start and the report's return). A step starts only
# while its whole cap fits in what is left of the budget; otherwise it is reported
# `skipped: budget`, never `fail`. Steps marked `# kit-always` (the machine's state after the run)
# have their caps held back from the budget and always run. A step that fails, times out or
# crashes never stops the others. After every step it rewrites the report, so a run cut short
# still returns what finished. It returns exactly three files in --out (default $OUT, else a new
# folder it prints): gpu-report.md, gpu-report.json, gpu-logs.tar.gz.
#
# Order, by what a short GPU run must not lose: 00 loader, 10 print-env, 20 GPU gtests,
# 30 outputs against torch, 40 ResNet-50 (cuDNN benchmark on/off), 50 throughput and
# 55 request floor (the performance figures); then the fault paths and the operator's questions
# (60 cuDNN per model, 62 start to ready, 65 out of memory, 68 device-side assert, 70 memory
# cycles, 72 two instances, 74 HTTP, 75 ensemble tensors on the device, 76 SIGTERM under load,
# 78 latency target); the AOTInductor compile (80) and
# its out-of-memory (85) last, as the compile is the slowest; 99 the machine after the run.
#
# --python is the interpreter with the machine's torch (default: python3). It must be torch
# 2.11.0 built for CUDA 13.0 with the C++11 ABI: the kit's binaries were linked against exactly
# that LibTorch, whose libraries are taken from this machine's torch at run time.
# --no-gpu: steps that need a GPU do a small CPU dry run of their own logic and report
# `skipped: no GPU` (the test command runs the kit this way so that it cannot rot).
# --steps: another folder of steps (the self-test's fake steps check the budget logic).
#
# Step contract: a step is an executable *.py (run with --python) or *.sh file. It sees KIT, WORK
# (scratch shared by the steps), STEP_DIR (its own folder: logs, and result.json with status
# pass|fail|skipped, summary, numbers, details), KIT_NO_GPU (1 or 0), KIT_PYTHON, KIT_BIN (the
# kit's commands: wrappers that point only the kit's own binaries at the kit's libraries and this
# machine's torch; nothing else on the machine sees them) and PATH with KIT_BIN first. No
# result.json counts as a failure. A step writes its children's output to files in STEP_DIR as it
# goes, keeps inner timeouts below its cap, and rewrites result.json after each measured part.
set -uo pipefail
KIT=$(cd "$(dirname "$0")" && pwd)
NO_GPU=0
PY=python3
OUT_DIR=${OUT:-}
BUDGET=480
ONLY=""
STEPS=""
while (($#)); do
  case "$1" in
    --no-gpu) NO_GPU=1 ;;
    --python) PY=$2; shift ;;
    --out) OUT_DIR=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    --only) ONLY=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
START=$(date +%s)
STEPS=$(cd "${STEPS:-$KIT/steps}" && pwd)
[ -n "$OUT_DIR" ] || OUT_DIR=$(mktemp -d /tmp/sluice-gpu-report.XXXXXX)
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
echo "[gpu-kit] report: $OUT_DIR/gpu-report.md"
WORK=$(mktemp -d /tmp/sluice-gpu-kit-work.XXXXXX)
mkdir -p "$WORK/steps"
export KIT WORK KIT_NO_GPU=$NO_GPU KIT_PYTHON=$PY

# The same LibTorch as the kit was built against, or nothing runs.
if ! TORCH_LIB=$("$PY" - "$KIT/MANIFEST.json" <<'EOF'
import json, os, sys
try:
    import torch
except Exception as error:  # noqa: BLE001
    sys.exit(f"{sys.executable} has no usable torch: {error}")
want = json.load(open(sys.argv[1]))
base = lambda v: v.split("+")[0]
got = {"torch": torch.__version__, "cuda": torch.version.cuda, "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI)}
if base(got["torch"]) != base(want["torch"]) or got["cuda"] != want["cuda"] or got["cxx11_abi"] != want["cxx11_abi"]:
    sys.exit(f"this machine's torch is {got}; the kit was built against {want['torch']} (CUDA {want['cuda']}, "
             f"cxx11_abi {want['cxx11_abi']}): its binaries would not load or would misbehave. Run it with "
             "--python pointing at torch 2.11.0+cu130, or rebuild the kit against this torch.")
# torch's lib dir, then the nvidia/* wheels' (libcudart, cuDNN, ...) that torch's own RUNPATH finds
# but the kit's binaries, which need libcudart directly, would not.
import glob
site = os.path.dirname(os.path.dirname(torch.__file__))
print(":".join([os.path.join(site, "torch", "lib")] + sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib")))))
EOF
); then
  exit 3
fi
# Only the kit's own binaries see the kit's libraries and this machine's torch: each command in
# KIT_BIN is a wrapper that sets LD_LIBRARY_PATH for that one process and execs the real binary in
# libexec (RUNPATH $ORIGIN/../lib). Python, the compiler of the AOTInductor step and everything
# else keep the machine's own environment. The machine's own path stays last: the driver's
# libraries (libcuda, libnvidia-ml) may be found only through it.
KIT_BIN=$WORK/bin
mkdir -p "$KIT_BIN"
# Binaries that travel xz-compressed (perf_analyzer: the kit's size limit) are unpacked first.
for packed in "$KIT"/libexec/*.xz; do
  [ -f "$packed" ] || continue
  [ -f "${packed%.xz}" ] || "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$packed" "${packed%.xz}"
  chmod +x "${packed%.xz}"
done
for binary in "$KIT"/libexec/*; do
  [ -f "$binary" ] || continue
  case "$binary" in *.xz) continue ;; esac
  cat >"$KIT_BIN/$(basename "$binary")" <<WRAP
#!/bin/sh
LD_LIBRARY_PATH="$KIT/lib:$TORCH_LIB\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$binary" "\$@"
WRAP
  chmod +x "$KIT_BIN/$(basename "$binary")"
done
# The server's bundled operator libraries travel xz-compressed (the kit's size limit: 7.8 MB
# of torchvision operators are 1.1 MB so); unpacked where the server looks (libexec/../lib/sluice).
for packed in "$KIT"/lib/sluice/*.xz; do
  [ -f "$packed" ] || continue
  [ -f "${packed%.xz}" ] || "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$packed" "${packed%.xz}"
done
export KIT_BIN KIT_LD_LIBRARY_PATH="$KIT/lib:$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$KIT_BIN:$PATH"
export PYTHONPATH="$WORK/site:$KIT/src/tests/integration:$KIT/src/tests:$KIT/src/benchmarks:$KIT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 SLUICE_BIN_DIR="$KIT_BIN"

# The machine, as found: recorded before anything runs.
{
  echo "uname -r: $(uname -r)"
  echo "started: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "no_gpu: $NO_GPU"
  echo "python: $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
  echo "torch: $("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())')"
  echo "torch_libs: $TORCH_LIB"
  echo "nproc: $(nproc)"
  if command -v nvidia-smi >/dev/null; then
    echo "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -1)"
    echo "--- nvidia-smi"
    nvidia-smi 2>&1
  else
    echo "driver: nvidia-smi not found"
  fi
} >"$WORK/machine.txt" 2>&1

# Python packages the checks need and this python lacks (wheels/requirements.txt).
"$PY" "$KIT/kitlib.py" install-wheels "$KIT/wheels" "$WORK/site" >"$WORK/wheels.txt" 2>&1 \
  || echo "[gpu-kit] warning: installing the kit's wheels failed (see wheels.txt in the logs)" >&2

report() { "$PY" "$KIT/report.py" --kit "$KIT" --work "$WORK" --out "$OUT_DIR" --elapsed $(($(date +%s) - START)); }
report

cap_of() { local cap; cap=$(sed -n 's/^# kit-timeout: *\([0-9][0-9]*\).*/\1/p' "$1" | head -1); echo "${cap:-60}"; }
always() { grep -q '^# kit-always' "$1"; }
selected() { local name; name=$(basename "${1%.*}"); [ -z "$ONLY" ] || [[ ",$ONLY," == *",$name,"* ]]; }

# The caps of the steps that always run are held back from the budget.
RESERVED=0
for step in "$STEPS"/[0-9]*; do
  if selected "$step" && always "$step"; then RESERVED=$((RESERVED + $(cap_of "$step"))); fi
done

for step in "$STEPS"/[0-9]*; do
  file=$(basename "$step")
  name=${file%.*}
  selected "$step" || continue
  dir=$WORK/steps/$name
  mkdir -p "$dir"
  cap=$(cap_of "$step")
  if always "$step"; then
    RESERVED=$((RESERVED - cap))
  else
    left=$((BUDGET - RESERVED - ($(date +%s) - START)))
    if ((cap > left)); then
      printf '{"status": "skipped", "summary": "skipped: budget (its cap is %s s, %s s of the %s s budget were left)", "seconds": 0}\n' \
        "$cap" "$((left > 0 ? left : 0))" "$BUDGET" >"$dir/result.json"
      echo "[gpu-kit] $name: skipped: budget"
      report
      continue
    fi
  fi
  echo "[gpu-kit] $name (cap ${cap}s)"
  case "$file" in
    *.py) cmd=("$PY" "$step") ;;
    *) cmd=(bash "$step") ;;
  esac
  began=$(date +%s.%N)
  # timeout signals the step's whole process group: servers a step started go with it.
  STEP_DIR=$dir timeout -k 5 "$cap" "${cmd[@]}" >"$dir/log" 2>&1
  rc=$?
  ended=$(date +%s.%N)
  "$PY" - "$dir" "$rc" "$cap" "$began" "$ended" <<'EOF'
import json, os, sys
directory, rc, cap, began, ended = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
path = os.path.join(directory, "result.json")
try:
    result = json.load(open(path))
except (OSError, ValueError):
    tail = open(os.path.join(directory, "log"), errors="replace").read()[-3000:]
    why = f"timed out after {cap} s" if rc in (124, 137) else f"exited {rc} without a result"
    result = {"status": "fail", "summary": why, "details": "```\n" + tail + "\n```"}
if rc in (124, 137) and result.get("status") != "fail":
    result["status"], result["summary"] = "fail", f"timed out after {cap} s; " + result.get("summary", "")
result["seconds"] = round(ended - began, 1)
result["exit_code"] = rc
json.dump(result, open(path, "w"), indent=2)
EOF
  echo "[gpu-kit] $name: $("$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["status"], "-", r.get("summary", ""))' "$dir/result.json")"
  report
done
echo "[gpu-kit] done in $(($(date +%s) - START)) s: $OUT_DIR/gpu-report.md"
rm -rf "$WORK"
