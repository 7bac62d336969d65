#!/usr/bin/env python3
"""Dynamic batching benchmark: in-process LibTorch against Sluice through perf_analyzer, side by
side in one run, on the bundled MLP (784-512-512-10) and conv net.

    .venv/bin/python benchmarks/batching_benchmark.py [--smoke] [--json out.json]

1. The ceiling: sluice-bench-inprocess, forward throughput and p50 at batch sizes 1, 2, 4, ... max.
2. Sluice through perf_analyzer (--async) at concurrency 1, 4, 16, 32, 64 with batching on and
   off (the same model files; "on" keeps the bundled configs' dynamic_batching block, "off"
   removes it), one server
   per model and mode.
3. Ratios: Sluice at saturation / in-process at the batch size Sluice formed; batching on / off;
   Sluice p50 at concurrency 1 minus in-process p50 at batch 1 (the single-request overhead).

The server and the ceiling run on one CPU and perf_analyzer on another (taskset; one intra-op
thread, as the server's default split gives a single instance on one CPU), so that latencies
measure the server, not its contention with the client. --no-pin shares every CPU, as runs
before 2026-12-01 did.

Prints a table and writes JSON. --smoke runs a tiny version (the test command runs it so the
script keeps working); its numbers mean nothing.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from harness import perf_analyzer as harness_perf_analyzer  # noqa: E402
from harness.bench import MODELS, make_repository, pinning, serve, statistics, write_json  # noqa: E402,F401
TARGETS = {"convnet_saturation_ratio": 0.90, "mlp_on_off_ratio_c32": 3.0, "overhead_p50_us": 150.0}


def inprocess(bin_dir, repository, smoke, threads, models, prefix=()):
    results = {}
    for name in models:
        row_shape, max_batch = MODELS[name]
        sizes = [1, 2] if smoke else [b for b in (1, 2, 4, 8, 16, 32, 64) if b <= max_batch]
        out = subprocess.run(
            [*prefix, os.path.join(bin_dir, "sluice-bench-inprocess"), "--model",
             os.path.join(repository, name, "1", "model.pt"), "--row-shape", ",".join(map(str, row_shape)),
             "--batch-sizes", ",".join(map(str, sizes)), "--seconds", "0.05" if smoke else "2",
             "--threads", str(threads)],
            check=True, capture_output=True, text=True).stdout
        results[name] = {row["batch"]: row for row in map(json.loads, out.splitlines())}
    return results


def perf_analyzer(url, model, concurrency, smoke, workdir, prefix=()):
    before = statistics(url, model)
    # Asynchronous clients: fewer client threads competing with the server for the cores.
    row = harness_perf_analyzer.run(url, model, concurrency, os.path.join(workdir, f"{model}_{concurrency}.csv"),
                                    smoke=smoke, prefix=prefix)
    after = statistics(url, model)
    executions = after[1] - before[1]
    return {
        "concurrency": concurrency,
        "infer_per_s": float(row["Inferences/Second"]),
        "p50_us": float(row["p50 latency"]),
        "p99_us": float(row["p99 latency"]),
        "server_queue_us": float(row.get("Server Queue", 0) or 0),
        "server_compute_us": float(row.get("Server Compute Infer", 0) or 0),
        "avg_batch": (after[0] - before[0]) / executions if executions else 0.0,
    }


def nearest(table, batch):
    return min(table, key=lambda b: abs(b - batch))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny run: checks the script, measures nothing")
    parser.add_argument("--json", default=os.path.join(ROOT, "build", "batching_benchmark.json"))
    parser.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    parser.add_argument("--no-pin", action="store_true",
                        help="share every CPU between server and perf_analyzer (how runs before 2026-12-01 "
                             "were measured: their latencies measure the contention)")
    args = parser.parse_args()
    concurrencies = [1, 4] if args.smoke else [1, 4, 16, 32, 64]
    # The smoke run drives the MLP only: the conv net takes the same code path, and each model
    # costs the smoke run two servers and four perf_analyzer runs.
    models = ["mlp"] if args.smoke else list(MODELS)
    (server_prefix, client_prefix), pin_note = pinning(not args.no_pin)
    # Pinned, the server (and the ceiling, on the same CPU) has one CPU: one intra-op thread.
    cores = 1 if server_prefix else (os.cpu_count() or 1)
    print(f"pinning: {pin_note}")

    workdir = tempfile.mkdtemp(prefix="sluice-bench-")
    try:
        # One server per model and mode, as one model per replica is deployed: its single CPU
        # instance gets all cores (the server's default split), and so does the ceiling.
        ceiling_repo = os.path.join(workdir, "ceiling")
        make_repository(ceiling_repo, batching=False, names=models)
        ceiling = inprocess(args.bin_dir, ceiling_repo, args.smoke, threads=cores, models=models, prefix=server_prefix)
        served = {"on": {}, "off": {}}
        for mode in served:
            for name in models:
                path = os.path.join(workdir, f"{mode}-{name}")
                make_repository(path, batching=(mode == "on"), names=[name])
                process, url = serve(args.bin_dir, path, prefix=server_prefix)
                try:
                    served[mode][name] = [perf_analyzer(url, name, c, args.smoke, workdir, client_prefix)
                                          for c in concurrencies]
                finally:
                    process.send_signal(signal.SIGTERM)
                    process.wait(timeout=30)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    ratios = {}
    for name in models:
        on = served["on"][name]
        best = max(on, key=lambda r: r["infer_per_s"])
        formed = nearest(ceiling[name], best["avg_batch"])
        ratios[f"{name}_saturation_ratio"] = best["infer_per_s"] / ceiling[name][formed]["rows_per_s"]
        ratios[f"{name}_saturation_batch"] = formed
        by_c = {r["concurrency"]: r for r in served["off"][name]}
        on_c = {r["concurrency"]: r for r in on}
        top = 32 if 32 in by_c else max(by_c)
        ratios[f"{name}_on_off_ratio_c{top}"] = on_c[top]["infer_per_s"] / by_c[top]["infer_per_s"]
        ratios[f"{name}_overhead_p50_us"] = by_c[1]["p50_us"] - ceiling[name][1]["p50_us"]
    ratios["overhead_p50_us"] = ratios["mlp_overhead_p50_us"]

    print(f"\nIn-process LibTorch ({cores} intra-op threads)")
    print(f"{'model':8} {'batch':>5} {'rows/s':>10} {'p50 us':>8}")
    for name, table in ceiling.items():
        for batch, row in table.items():
            print(f"{name:8} {batch:5d} {row['rows_per_s']:10.0f} {row['p50_us']:8.1f}")
    print("\nSluice through perf_analyzer (-b 1)")
    print(f"{'model':8} {'batching':8} {'conc':>4} {'infer/s':>9} {'p50 us':>8} {'p99 us':>8} {'avg batch':>9}")
    for mode in ("off", "on"):
        for name in models:
            for r in served[mode][name]:
                print(f"{name:8} {mode:8} {r['concurrency']:4d} {r['infer_per_s']:9.0f} {r['p50_us']:8.0f} "
                      f"{r['p99_us']:8.0f} {r['avg_batch']:9.2f}")
    print("\nRatios (targets: convnet saturation >= 0.90, mlp on/off at c32 >= 3.0, overhead <= 150 us)")
    for key, value in ratios.items():
        print(f"  {key:32} {value:10.3f}")
    report = {"smoke": args.smoke, "cores": cores, "pinning": pin_note, "inprocess": ceiling, "sluice": served,
              "ratios": ratios, "targets": TARGETS}
    write_json(args.json, report)


if __name__ == "__main__":
    main()
