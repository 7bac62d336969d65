#!/usr/bin/env python3
"""The REST endpoint against gRPC on the bundled MLP (784-512-512-10), side by side in one run,
with the same third-party client (perf_analyzer) and one server:

    .venv/bin/python benchmarks/http_benchmark.py [--smoke] [--repetitions 3] [--json out.json]

Modes, each at concurrency 1 and 16 (batch 1, dynamic batching as the bundled config has it):
  grpc          perf_analyzer -i grpc
  http-binary   perf_analyzer -i http (Triton's binary tensor extension, its default)
  http-json     perf_analyzer -i http --input-tensor-format json --output-tensor-format json

Repetitions are interleaved (every mode once, then again) so that a slow stretch of a noisy host
hits every mode; the table shows medians and each HTTP mode's ratio to gRPC. The server runs on
one CPU and perf_analyzer on another (taskset), as in batching_benchmark.py.

Prints a table and writes JSON. --smoke runs a tiny version (the test command runs it so the
script keeps working: concurrency 1 only); its numbers mean nothing.
"""
import argparse
import os
import re
import signal
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from harness.bench import make_repository, pinning, serve, write_json  # noqa: E402
from harness import perf_analyzer  # noqa: E402

MODES = {
    "grpc": ["-i", "grpc"],
    "http-binary": ["-i", "http"],
    "http-json": ["-i", "http", "--input-tensor-format", "json", "--output-tensor-format", "json"],
}
CONCURRENCY = (1, 16)


def measure(model, mode_args, url, concurrency, smoke, out_csv, prefix):
    """One perf_analyzer run of `model` with `mode_args` (batch 1): throughput and latencies."""
    # A noisy shared host never looks "stable": accept any spread and take medians over the
    # interleaved repetitions instead.
    row = perf_analyzer.run(url, model, concurrency, out_csv, smoke=smoke, protocol=mode_args, asynchronous=False,
                            stability=1000, prefix=prefix)
    return {"infer_per_s": float(row["Inferences/Second"]), "p50_us": float(row["p50 latency"]),
            "p99_us": float(row["p99 latency"])}


def http_port(log_path):
    with open(log_path) as f:
        found = re.search(r"event=http_listening address=\S+ port=(\d+)", f.read())
    if not found:
        raise RuntimeError(f"no event=http_listening line in {log_path}")
    return int(found.group(1))


def parse_args(doc):
    """The flags of the perf_analyzer comparisons (this one and transport_benchmark.py):
    (args, repetitions, (server prefix, client prefix), pinning note)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dir", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                          "build", "bin"))
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    repetitions = 1 if args.smoke else args.repetitions
    prefixes, pin_note = pinning(not args.no_pin)
    return args, repetitions, prefixes, pin_note


def main():
    args, repetitions, (server_prefix, client_prefix), pin_note = parse_args(__doc__)

    concurrencies = CONCURRENCY[:1] if args.smoke else CONCURRENCY
    runs = {(mode, c): [] for mode in MODES for c in concurrencies}
    with tempfile.TemporaryDirectory() as workdir:
        repository = os.path.join(workdir, "models")
        make_repository(repository, batching=True, names=["mlp"])
        process, grpc_url = serve(args.bin_dir, repository, ["--device", "cpu", "--http-address", "127.0.0.1"],
                                  prefix=server_prefix, log_level="info")
        try:
            urls = {"grpc": grpc_url}
            urls["http-binary"] = urls["http-json"] = f"127.0.0.1:{http_port(repository + '.log')}"
            for _ in range(repetitions):
                for mode in MODES:
                    for c in concurrencies:
                        out_csv = os.path.join(workdir, f"{mode}_{c}.csv")
                        runs[(mode, c)].append(measure("mlp", MODES[mode], urls[mode], c, args.smoke, out_csv,
                                                       client_prefix))
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)

    rows = []
    for (mode, c), results in runs.items():
        median = {key: statistics.median(r[key] for r in results) for key in ("infer_per_s", "p50_us", "p99_us")}
        rows.append({"mode": mode, "concurrency": c, **median, "runs": results})
    grpc = {row["concurrency"]: row for row in rows if row["mode"] == "grpc"}
    for row in rows:
        base = grpc[row["concurrency"]]
        row["p50_vs_grpc"] = row["p50_us"] / base["p50_us"] if base["p50_us"] else 0.0
        row["throughput_vs_grpc"] = row["infer_per_s"] / base["infer_per_s"] if base["infer_per_s"] else 0.0

    print(f"\nMLP, batch 1, perf_analyzer; medians of {repetitions} interleaved run(s); pinning: {pin_note}")
    print(f"{'mode':<12} {'c':>3} {'infer/s':>9} {'p50 us':>9} {'p99 us':>9} {'p50/gRPC':>9} {'thru/gRPC':>10}")
    for row in rows:
        print(f"{row['mode']:<12} {row['concurrency']:>3} {row['infer_per_s']:>9.0f} {row['p50_us']:>9.0f} "
              f"{row['p99_us']:>9.0f} {row['p50_vs_grpc']:>9.2f} {row['throughput_vs_grpc']:>10.2f}")
    if args.json:
        write_json(args.json, {"benchmark": "http", "smoke": args.smoke, "repetitions": repetitions,
                               "pinning": pin_note, "rows": rows})


if __name__ == "__main__":
    main()
