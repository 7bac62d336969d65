#!/usr/bin/env python3
"""What the bundled torchvision operators cost a request that does not use them, and the server's
start: the same sluice-server run with --torchvision-ops off and auto (the library loaded).

    .venv/bin/python benchmarks/operator_libraries_cost_benchmark.py [--smoke] [--json out.json]
        [--requests N] [--starts N]

Instructions per request, counted by valgrind's callgrind as in metrics_cost_benchmark.py: the
bundled MLP (one intra-op thread, no warm-up, on the CPU), `--requests` single-row requests over
gRPC sent one at a time by tritonclient after `--warm` uncounted ones, every server thread counted.
Start-up: the median of `--starts` runs of `sluice-server --print-env --device cpu` per mode
(LibTorch's own load included, the same in both), taken alternately.

Target: auto / off below 1.02 instructions per request. Prints a table, writes JSON. --smoke runs
each mode once without valgrind (the test command runs it so the script keeps working): no ratio.
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from harness.bench import write_json  # noqa: E402
from harness import callgrind  # noqa: E402

TARGET_RATIO = 1.02
MODES = ("off", "auto")


def measure(bin_dir, repository, mode, requests, warm, workdir, valgrind):
    sender = callgrind.MlpRows()
    counted = callgrind.count_requests(
        os.path.join(bin_dir, "sluice-server"), repository,
        ["--allow-http", "false", "--warmup", "false", "--device", "cpu", "--torchvision-ops", mode],
        os.path.join(workdir, f"callgrind.{mode}"), requests, warm, sender.send, valgrind=valgrind)
    sender.close()
    return {"torchvision_ops": mode, "requests": requests, "instructions": counted["instructions"],
            "instructions_per_request": counted["instructions_per_request"], "seconds": counted["seconds"]}


def start_seconds(bin_dir, mode):
    started = time.perf_counter()
    subprocess.run([os.path.join(bin_dir, "sluice-server"), "--print-env", "--device", "cpu", "--torchvision-ops",
                    mode], check=True, capture_output=True, timeout=120)
    return time.perf_counter() - started


def main():
    parser = callgrind.cost_arguments(__doc__, "operator_libraries_cost")
    parser.add_argument("--starts", type=int, default=15)
    args = parser.parse_args()
    if not args.smoke:
        callgrind.require_valgrind()
    requests, warm, starts = (3, 1, 1) if args.smoke else (args.requests, args.warm, args.starts)
    starts_by_mode = {mode: [] for mode in MODES}
    for _ in range(starts):
        for mode in MODES:
            starts_by_mode[mode].append(start_seconds(args.bin_dir, mode))
    with tempfile.TemporaryDirectory() as workdir:
        repository = callgrind.MlpRows.write_repository(os.path.join(workdir, "models"))
        rows = [measure(args.bin_dir, repository, mode, requests, warm, workdir, not args.smoke) for mode in MODES]
    for row in rows:
        row["start_median_s"] = statistics.median(starts_by_mode[row["torchvision_ops"]])
        row["starts"] = len(starts_by_mode[row["torchvision_ops"]])
    if args.smoke:
        print("\nsmoke: both modes served (no valgrind, no ratio)")
        write_json(args.json, {"benchmark": "operator_libraries_cost", "smoke": True, "rows": rows})
        return
    off, auto = rows
    ratio = auto["instructions_per_request"] / off["instructions_per_request"]
    print(f"\nThe bundled torchvision operators' cost (callgrind, bundled MLP, batch 1, {requests} requests; "
          f"--print-env median of {starts})")
    print(f"{'torchvision-ops':16} {'instructions':>14} {'per request':>12} {'start s':>9}")
    for row in rows:
        print(f"{row['torchvision_ops']:16} {row['instructions']:14d} {row['instructions_per_request']:12.0f} "
              f"{row['start_median_s']:9.3f}")
    print(f"auto / off = {ratio:.4f} instructions per request (target < {TARGET_RATIO}; "
          f"{'met' if ratio < TARGET_RATIO else 'not met'}); start +{auto['start_median_s'] - off['start_median_s']:.3f} s")
    write_json(args.json, {"benchmark": "operator_libraries_cost", "smoke": False, "target_ratio": TARGET_RATIO,
                           "rows": rows, "ratio_auto_off": ratio})


if __name__ == "__main__":
    main()
