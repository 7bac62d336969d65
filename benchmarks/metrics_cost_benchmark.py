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
import argparse
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from harness.bench import ROOT, make_repository, write_json  # noqa: E402
from harness import callgrind  # noqa: E402
from harness.server import SluiceServer  # noqa: E402

TARGET_RATIO = 1.02


def measure(bin_dir, repository, metrics, requests, warm, workdir):
    import tritonclient.grpc as grpcclient
    dump = os.path.join(workdir, f"callgrind.{'on' if metrics else 'off'}")
    server = SluiceServer(
        os.path.join(bin_dir, "sluice-server"), repository,
        ["--metrics-address", "127.0.0.1", "--allow-http", "false", "--allow-metrics", "true" if metrics else "false",
         "--warmup", "false", "--device", "cpu"],
        log_path=dump + ".log", log_level="warn", metrics_port=0, http_port=None,
        prefix=callgrind.command(dump))
    try:
        server.start(timeout=600)
        client = grpcclient.InferenceServerClient(url=server.url)
        data = np.random.default_rng(0).random((1, 784), dtype=np.float32)
        tensor = grpcclient.InferInput("INPUT__0", [1, 784], "FP32")
        tensor.set_data_from_numpy(data)
        for _ in range(warm):
            client.infer("mlp", [tensor])
        counted = callgrind.window(server.process.pid, dump,
                                   lambda: [client.infer("mlp", [tensor]) for _ in range(requests)])
        client.close()
    finally:
        server.stop(timeout=120)
    return {"metrics": metrics, "requests": requests, "instructions": counted["instructions"],
            "instructions_per_request": counted["instructions"] / requests,
            "seconds_under_valgrind": counted["seconds"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    parser.add_argument("--json", default=os.path.join(ROOT, "build", "metrics_cost_benchmark.json"))
    parser.add_argument("--smoke", action="store_true", help="a tiny run that only checks the script works")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--warm", type=int, default=30)
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind is missing (scripts/setup.sh installs it)")
    requests, warm = (5, 2) if args.smoke else (args.requests, args.warm)
    with tempfile.TemporaryDirectory() as workdir:
        repository = os.path.join(workdir, "models")
        make_repository(repository, batching=False, names=["mlp"])
        with open(os.path.join(repository, "mlp", "config.pbtxt"), "a") as f:
            # One forward-pass thread: OpenMP workers spinning under valgrind count as noise.
            f.write('\nparameters { key: "INTRA_OP_THREAD_COUNT" value { string_value: "1" } }\n')
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
