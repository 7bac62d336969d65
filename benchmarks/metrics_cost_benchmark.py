#!/usr/bin/env python3
"""What Prometheus metrics cost per request: instructions counted by valgrind's callgrind, the
server run with --allow-metrics true and false, over the same fixed number of requests.

    .venv/bin/python benchmarks/metrics_cost_benchmark.py [--smoke] [--json out.json] [--requests N]

Wall-clock throughput on a shared 2-core machine is far too noisy to see a 2 % difference;
instruction counts are not. For each mode, sluice-server runs under callgrind with collection off
(the bundled MLP, one intra-op thread, no warm-up, on the CPU) with instrumentation off; after it
is ready and `--warm` requests have run, instrumentation is switched on and the counters zeroed
(callgrind_control), `--requests` single-row requests are sent one at a time by tritonclient
(another process, not counted), and the counts are dumped. Every thread of the server is counted: gRPC, the scheduler's worker,
the forward pass, and with metrics on the recording and the /metrics endpoint's idle thread.
Nothing scrapes /metrics in the window (a scrape is per scrape interval, not per request).

Target: metrics on / off below 1.02 instructions per request. Prints a table, writes JSON.
--smoke runs a tiny version (the test command runs it so the script keeps working): metrics on
only, so no ratio.
"""
import os
import sys
import tempfile


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from harness.bench import write_json  # noqa: E402
from harness import callgrind  # noqa: E402

TARGET_RATIO = 1.02


def measure(bin_dir, repository, metrics, requests, warm, workdir):
    sender = callgrind.MlpRows()
    counted = callgrind.count_requests(
        os.path.join(bin_dir, "sluice-server"), repository,
        ["--metrics-address", "127.0.0.1", "--allow-http", "false", "--allow-metrics", "true" if metrics else "false",
         "--warmup", "false", "--device", "cpu"],
        os.path.join(workdir, f"callgrind.{'on' if metrics else 'off'}"), requests, warm, sender.send)
    sender.close()
    return {"metrics": metrics, "requests": requests, "instructions": counted["instructions"],
            "instructions_per_request": counted["instructions_per_request"],
            "seconds_under_valgrind": counted["seconds"]}


def main():
    parser = callgrind.cost_arguments(__doc__, "metrics_cost")
    args = parser.parse_args()
    callgrind.require_valgrind()
    requests, warm = (5, 2) if args.smoke else (args.requests, args.warm)
    with tempfile.TemporaryDirectory() as workdir:
        repository = callgrind.MlpRows.write_repository(os.path.join(workdir, "models"))
        # The smoke run starts the server under valgrind once (metrics on), not twice: it only
        # checks that the script works, and each start under valgrind costs about 35 s of the
        # test command.
        settings = (True,) if args.smoke else (False, True)
        rows = [measure(args.bin_dir, repository, metrics, requests, warm, workdir) for metrics in settings]
    if args.smoke:
        print(f"\nsmoke: {rows[0]['instructions']} instructions for {requests} requests with metrics on "
              "(no off run, no ratio)")
        write_json(args.json, {"benchmark": "metrics_cost", "smoke": True, "rows": rows})
        return
    off, on = rows
    ratio = on["instructions_per_request"] / off["instructions_per_request"] if off["instructions"] else float("nan")
    print(f"\nMetrics cost, instructions per request (callgrind, bundled MLP, batch 1, {requests} requests)")
    print(f"{'metrics':8} {'instructions':>14} {'per request':>12}")
    for row in rows:
        print(f"{('on' if row['metrics'] else 'off'):8} {row['instructions']:14d} {row['instructions_per_request']:12.0f}")
    print(f"on / off = {ratio:.4f} (target < {TARGET_RATIO}; {'met' if ratio < TARGET_RATIO else 'not met'}), "
          f"+{on['instructions_per_request'] - off['instructions_per_request']:.0f} instructions per request")
    write_json(args.json, {"benchmark": "metrics_cost", "smoke": args.smoke, "target_ratio": TARGET_RATIO,
                           "rows": rows, "ratio_on_off": ratio})


if __name__ == "__main__":
    main()
