#!/usr/bin/env python3
"""How a request's bytes reach the server: unary gRPC calls, one ModelStreamInfer stream per
client, and system shared memory, side by side in one run with the same third-party client
(perf_analyzer) and one server:

    .venv/bin/python benchmarks/transport_benchmark.py [--smoke] [--repetitions 3] [--json out.json]

Models (batch 1, dynamic batching):
  mlp         the bundled MLP: 3 KiB in, 40 bytes out; the transport is a small part of the cost
  big_input   a [1048576] FP32 input (4 MiB) summed to one number: almost all transport
Modes, each at concurrency 1 and 16:
  unary       perf_analyzer -i grpc
  streaming   perf_analyzer -i grpc --streaming
  shm         perf_analyzer -i grpc --shared-memory system (inputs and outputs in regions it
              registers; the request carries only their names)

Repetitions are interleaved (every mode once, then again) so that a slow stretch of a noisy host
hits every mode; the table shows medians and each mode's ratio to unary. The server runs on one
CPU and perf_analyzer on another (taskset), as in batching_benchmark.py.

Prints a table and writes JSON. --smoke runs a tiny version (the test command runs it so the
script keeps working: big_input at concurrency 1 only); its numbers mean nothing.
"""
import os
import signal
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from harness.bench import make_repository, serve, write_json  # noqa: E402
from http_benchmark import measure, parse_args  # noqa: E402

MODES = {
    "unary": ["-i", "grpc"],
    "streaming": ["-i", "grpc", "--streaming"],
    "shm": ["-i", "grpc", "--shared-memory", "system", "--output-shared-memory-size", "4096"],
}
MODELS = ("mlp", "big_input")
CONCURRENCY = (1, 16)
BIG_ELEMENTS = 1 << 20  # 4 MiB of FP32


class Sum(torch.nn.Module):
    def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:
        return INPUT__0.sum(dim=1, keepdim=True)


def add_big_input(repository):
    directory = os.path.join(repository, "big_input")
    os.makedirs(os.path.join(directory, "1"))
    with open(os.path.join(directory, "config.pbtxt"), "w") as f:
        f.write(f"""max_batch_size: 16
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {BIG_ELEMENTS} ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
dynamic_batching {{ }}
""")
    torch.jit.script(Sum()).save(os.path.join(directory, "1", "model.pt"))


def main():
    args, repetitions, (server_prefix, client_prefix), pin_note = parse_args(__doc__)

    concurrencies = CONCURRENCY[:1] if args.smoke else CONCURRENCY
    models = MODELS[1:] if args.smoke else MODELS  # the smoke run: big_input only (mlp: http_benchmark's)
    runs = {(model, mode, c): [] for model in models for mode in MODES for c in concurrencies}
    with tempfile.TemporaryDirectory() as workdir:
        repository = os.path.join(workdir, "models")
        make_repository(repository, batching=True, names=["mlp"])
        add_big_input(repository)
        # perf_analyzer keys its regions "/" + the tensor's name (+ "_<stream>_<step>" for inputs).
        process, url = serve(args.bin_dir, repository, ["--device", "cpu", "--allow-http", "false",
                                                        "--allow-client-shm=true",
                                                        "--client-shm-keys=/INPUT__,/OUTPUT__"],
                             prefix=server_prefix, log_level="info")
        try:
            for _ in range(repetitions):
                for model, mode, c in runs:
                    out_csv = os.path.join(workdir, f"{model}_{mode}_{c}.csv")
                    runs[(model, mode, c)].append(measure(model, MODES[mode], url, c, args.smoke, out_csv,
                                                          client_prefix))
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)

    rows = []
    for (model, mode, c), results in runs.items():
        median = {key: statistics.median(r[key] for r in results) for key in ("infer_per_s", "p50_us", "p99_us")}
        rows.append({"model": model, "mode": mode, "concurrency": c, **median, "runs": results})
    unary = {(row["model"], row["concurrency"]): row for row in rows if row["mode"] == "unary"}
    for row in rows:
        base = unary[(row["model"], row["concurrency"])]
        row["p50_vs_unary"] = row["p50_us"] / base["p50_us"] if base["p50_us"] else 0.0
        row["throughput_vs_unary"] = row["infer_per_s"] / base["infer_per_s"] if base["infer_per_s"] else 0.0

    print(f"\nbatch 1, perf_analyzer; medians of {repetitions} interleaved run(s); pinning: {pin_note}")
    print(f"{'model':<10} {'mode':<10} {'c':>3} {'infer/s':>9} {'p50 us':>9} {'p99 us':>9} {'p50/unary':>10} "
          f"{'thru/unary':>11}")
    for row in rows:
        print(f"{row['model']:<10} {row['mode']:<10} {row['concurrency']:>3} {row['infer_per_s']:>9.0f} "
              f"{row['p50_us']:>9.0f} {row['p99_us']:>9.0f} {row['p50_vs_unary']:>10.2f} "
              f"{row['throughput_vs_unary']:>11.2f}")
    if args.json:
        write_json(args.json, {"benchmark": "transport", "smoke": args.smoke, "repetitions": repetitions,
                               "pinning": pin_note, "big_input_bytes": BIG_ELEMENTS * 4, "rows": rows})


if __name__ == "__main__":
    main()
