#!/usr/bin/env python3
"""What answering costs a model's worker: a model with a large output, served by one instance,
over gRPC, REST with binary outputs, and REST with a gzip-compressed answer, at concurrency 1
and 16, side by side for one or more servers in one run.

    .venv/bin/python benchmarks/answer_benchmark.py [--repetitions 3] [--json out.json]
        [--side 'LABEL BIN_DIR [ENV=VALUE | --flag=VALUE ...]'] ...
    .venv/bin/python benchmarks/answer_benchmark.py --smoke --bin-dir build/bin --json out.json

A model's worker runs the forward pass, copies the outputs into each request's answer, then
answers: over gRPC it serialises the response message (gRPC's Finish serialises on the calling
thread), over REST it writes the JSON header and, when the client sent Accept-Encoding: gzip,
compresses a small body itself (one of 64 KiB or more goes to the HTTP server's compression
threads; --http-compression-threads=0 keeps it on the worker, for an A/B). Only then does the
instance take its next batch. This measures that cost on a model whose forward pass is cheap
beside its output:

  wide   FP32 [64] in, FP32 [262144] out (1 MiB per row: sin of the tiled input times a
         ramp, values that compress about as badly as real activations: gzip keeps ~91 %),
         max_batch_size 8, dynamic batching, one instance, --device cpu

Modes (batch 1): grpc (perf_analyzer -i grpc), http (perf_analyzer -i http: binary outputs, its
default), http-gzip (tritonclient.http, one client per thread in a closed loop, binary outputs,
response_compression_algorithm="gzip": perf_analyzer has no way to ask for a compressed answer).
Each (side, mode, concurrency) runs once per repetition, interleaved; medians are shown.
Per window the server's own statistics give the compute time per execution (input + infer +
output, which ends before the answer) and how much of the window the instance spent computing
(`busy`): at c=16 the instance is never idle, so 1 - busy is what answering and the hand-off to
the next batch took.

--side (one quoted string, repeatable; default: one side "build" = --bin-dir): a label, a
directory holding sluice-server, and environment settings (ENV=VALUE) and server flags
(--flag=VALUE) for that server: an A/B of two builds, or of one build with and without a
setting. The first side is the baseline of the ratio columns.
The server runs on one CPU and perf_analyzer on another (taskset), as in batching_benchmark.py.

Prints a table and writes JSON. --smoke (the test command) runs grpc and http-gzip at c=1 with
tiny windows; its numbers mean nothing.
"""
import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from harness.bench import ROOT, pinning, serve, write_json  # noqa: E402
from http_benchmark import http_port, measure  # noqa: E402

MODEL = "wide"
ROW_IN, ROW_OUT, MAX_BATCH = 64, 262144, 8
MODES = {
    "grpc": ["-i", "grpc"],
    "http": ["-i", "http"],
    "http-gzip": None,  # perf_analyzer cannot inflate answers: tritonclient.http threads (gzip_load)
}
CONCURRENCY = (1, 16)
CONFIG = f"""name: "{MODEL}"
platform: "pytorch_libtorch"
max_batch_size: {MAX_BATCH}
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {ROW_IN} ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {ROW_OUT} ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
dynamic_batching {{ }}
"""
GENERATOR = f"""
import sys, torch
class Wide(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.linspace(1.0, 4096.0, {ROW_OUT}))
    def forward(self, x):
        return torch.sin(x.repeat(1, {ROW_OUT // ROW_IN}) * self.scale)
torch.jit.trace(Wide(), torch.zeros(2, {ROW_IN})).save(sys.argv[1])
"""


def make_repository(directory):
    os.makedirs(os.path.join(directory, MODEL, "1"))
    with open(os.path.join(directory, MODEL, "config.pbtxt"), "w") as f:
        f.write(CONFIG)
    subprocess.run([sys.executable, "-c", GENERATOR, os.path.join(directory, MODEL, "1", "model.pt")], check=True)


def model_stats(url):
    """(executions, compute ns: input + infer + output) of the model so far."""
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(url=url)
    try:
        stats = client.get_inference_statistics(MODEL).model_stats[0]
        # batch_stats count each execution once (inference_stats count it once per request in it).
        compute = sum(getattr(batch, key).ns for batch in stats.batch_stats
                      for key in ("compute_input", "compute_infer", "compute_output"))
        return stats.execution_count, compute
    finally:
        client.close()


def gzip_load(url, concurrency, smoke, prefix):
    """http-gzip's load: `concurrency` threads in a closed loop, each with its own client, in a
    child process behind `prefix` (its own CPU). Warm-up, then a measured window."""
    seconds, warmup = (0.5, 0.2) if smoke else (6.0, 1.0)
    script = f"""
import json, threading, time
import numpy as np
import tritonclient.http as httpclient
latencies, stop = [], [False]
def loop(measure_from):
    client = httpclient.InferenceServerClient("{url}")
    data = np.random.default_rng(0).random((1, {ROW_IN}), dtype=np.float32)
    given = httpclient.InferInput("INPUT__0", [1, {ROW_IN}], "FP32")
    given.set_data_from_numpy(data, binary_data=True)
    wanted = [httpclient.InferRequestedOutput("OUTPUT__0", binary_data=True)]
    while not stop[0]:
        start = time.monotonic()
        result = client.infer("{MODEL}", [given], outputs=wanted, response_compression_algorithm="gzip")
        end = time.monotonic()
        assert result.as_numpy("OUTPUT__0").shape == (1, {ROW_OUT})
        if start >= measure_from[0]:
            latencies.append((end, end - start))
    client.close()
measure_from = [time.monotonic() + {warmup}]
threads = [threading.Thread(target=loop, args=(measure_from,)) for _ in range({concurrency})]
for thread in threads:
    thread.start()
time.sleep({warmup + seconds})
window_end = time.monotonic()
stop[0] = True
for thread in threads:
    thread.join()
done = sorted(latency for end, latency in latencies if end <= window_end)
print(json.dumps({{"count": len(done), "seconds": window_end - measure_from[0],
                  "p50": done[len(done) // 2] if done else 0.0,
                  "p99": done[min(len(done) - 1, int(len(done) * 0.99))] if done else 0.0}}))
"""
    out = subprocess.run([*prefix, sys.executable, "-c", script], check=True, capture_output=True, text=True,
                         timeout=120).stdout
    found = json.loads(out.splitlines()[-1])
    if found["count"] == 0:
        raise RuntimeError(f"http-gzip c={concurrency}: no request finished in the window")
    return {"infer_per_s": found["count"] / found["seconds"], "p50_us": found["p50"] * 1e6,
            "p99_us": found["p99"] * 1e6}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    parser.add_argument("--side", action="append", metavar="'LABEL BIN_DIR [ENV=VALUE | --flag=VALUE ...]'",
                        help="a server to measure, one quoted string (repeatable); default: build = --bin-dir")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ", ".join(MODES))
    parser.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)), help="comma-separated")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    sides = []
    for side in [shlex.split(text) for text in args.side] if args.side else [["build", args.bin_dir]]:
        if len(side) < 2 or any("=" not in setting for setting in side[2:]):
            parser.error("--side takes LABEL BIN_DIR [ENV=VALUE | --flag=VALUE ...]")
        sides.append({"label": side[0], "bin_dir": side[1],
                      "flags": [setting for setting in side[2:] if setting.startswith("--")],
                      "env": dict(setting.split("=", 1) for setting in side[2:] if not setting.startswith("--"))})
    args.modes = args.modes.split(",")
    if any(mode not in MODES for mode in args.modes):
        parser.error(f"--modes: choose from {', '.join(MODES)}")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    return args, sides


def run_side(side, modes, concurrencies, smoke, workdir, prefixes):
    """One server of `side`: every mode and concurrency once; {(mode, c): result}."""
    server_prefix, client_prefix = prefixes
    repository = os.path.join(workdir, side["label"], "models")
    os.makedirs(os.path.dirname(repository), exist_ok=True)
    make_repository(repository)
    saved = {key: os.environ.get(key) for key in side["env"]}
    os.environ.update(side["env"])
    try:
        process, grpc_url = serve(side["bin_dir"], repository,
                                  ["--device", "cpu", "--http-address", "127.0.0.1", *side["flags"]],
                                  prefix=server_prefix, log_level="info")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    results = {}
    try:
        http_url = f"127.0.0.1:{http_port(repository + '.log')}"
        for mode in modes:
            for c in concurrencies:
                out_csv = os.path.join(workdir, f"{side['label']}_{mode}_{c}.csv")
                executions, compute = model_stats(grpc_url)
                start = time.monotonic()
                if MODES[mode] is None:
                    result = gzip_load(http_url, c, smoke, client_prefix)
                else:
                    result = measure(MODEL, MODES[mode], grpc_url if mode == "grpc" else http_url, c, smoke,
                                     out_csv, client_prefix)
                wall_ns = (time.monotonic() - start) * 1e9
                executions_after, compute_after = model_stats(grpc_url)
                ran = executions_after - executions
                result["compute_us_per_execution"] = (compute_after - compute) / ran / 1e3 if ran else 0.0
                result["busy"] = (compute_after - compute) / wall_ns
                results[(mode, c)] = result
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    return results


def main():
    args, sides = parse_args()
    repetitions = 1 if args.smoke else args.repetitions
    prefixes, pin_note = pinning(not args.no_pin)
    modes = ["grpc", "http-gzip"] if args.smoke else args.modes
    concurrencies = [1] if args.smoke else args.concurrency
    runs = {(side["label"], mode, c): [] for side in sides for mode in modes for c in concurrencies}
    with tempfile.TemporaryDirectory() as workdir:
        for repetition in range(repetitions):
            for side in sides:
                side_dir = os.path.join(workdir, str(repetition))
                for (mode, c), result in run_side(side, modes, concurrencies, args.smoke, side_dir, prefixes).items():
                    runs[(side["label"], mode, c)].append(result)

    keys = ("infer_per_s", "p50_us", "p99_us", "compute_us_per_execution", "busy")
    rows = []
    for (label, mode, c), results in runs.items():
        rows.append({"side": label, "mode": mode, "concurrency": c,
                     **{key: statistics.median(r[key] for r in results) for key in keys}, "runs": results})
    base = {(row["mode"], row["concurrency"]): row for row in rows if row["side"] == sides[0]["label"]}
    for row in rows:
        first = base[(row["mode"], row["concurrency"])]
        row["throughput_vs_first"] = row["infer_per_s"] / first["infer_per_s"] if first["infer_per_s"] else 0.0
        row["p50_vs_first"] = row["p50_us"] / first["p50_us"] if first["p50_us"] else 0.0

    print(f"\n{MODEL}: FP32 [{ROW_IN}] -> [{ROW_OUT}] ({ROW_OUT * 4 >> 20} MiB per row), one instance, "
          f"perf_analyzer batch 1; medians of {repetitions} interleaved run(s); pinning: {pin_note}")
    print(f"{'side':<10} {'mode':<10} {'c':>3} {'infer/s':>8} {'p50 us':>8} {'p99 us':>8} {'compute/exec us':>15} "
          f"{'busy':>5} {'thru/1st':>8} {'p50/1st':>8}")
    for row in rows:
        print(f"{row['side']:<10} {row['mode']:<10} {row['concurrency']:>3} {row['infer_per_s']:>8.1f} "
              f"{row['p50_us']:>8.0f} {row['p99_us']:>8.0f} {row['compute_us_per_execution']:>15.0f} "
              f"{row['busy']:>5.2f} {row['throughput_vs_first']:>8.3f} {row['p50_vs_first']:>8.3f}")
    if args.json:
        write_json(args.json, {"benchmark": "answer", "smoke": args.smoke, "repetitions": repetitions,
                               "pinning": pin_note, "sides": sides, "rows": rows})


if __name__ == "__main__":
    main()
