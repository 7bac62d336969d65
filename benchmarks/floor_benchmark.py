#!/usr/bin/env python3
"""Sluice against the transport's floor, in one run: a bare gRPC echo server
(sluice-bench-echo: no model, no parsing, an empty answer) and sluice-server, measured by the
same C++ load client (sluice-bench-load) with the same request bytes, the server on one CPU and
the client on another; in-process LibTorch (sluice-bench-inprocess, pinned to the server's CPU)
gives the forward pass's own cost.

    .venv/bin/python benchmarks/floor_benchmark.py [--reps 3] [--seconds 4] [--json out.json]
    .venv/bin/python benchmarks/floor_benchmark.py --smoke --bin-dir build/bin --json out.json

Models (sluice-server with its default flags: metrics, statistics and protocol checks on;
--device cpu; one instance each, so its intra-op threads = the CPUs it may use = 1):
  mlp      the bundled 784-512-512-10 MLP and config (dynamic_batching, max_batch_size 64)
  convnet  the bundled conv net and config (dynamic_batching, max_batch_size 32)
  convnet_every_size  the same conv net with sluice.auto_batch_sizes false (the batcher forms
           any size up to 32, as before the rule): the A/B for the rule
  addsub   two INT32 [16] inputs, a + b and a - b (request_path_benchmark's trivial model)
The ModelInfer request for the echo is the MLP's (3,136 bytes of FP32 plus the header).

Measured, per repetition (servers started fresh, sides alternating), medians reported:
  echo (callback API, as sluice-server), echo (completion-queue API): p50 at concurrency 1,
      calls/s at concurrency 32, server CPU per call at a fixed 2,000 calls/s
  sluice mlp: the same three, and the batch size the server formed at 32 (ModelStatistics)
  sluice addsub: p50 at concurrency 1 and server CPU per request at 2,000/s
  sluice convnet, convnet_every_size: requests/s at concurrency 8 and at 32
Server CPU time is utime + stime of the server process (/proc/<pid>/stat) over the window.

Targets (issue 20):
  mlp_c1_overhead_us    = sluice mlp p50 - (echo p50 + in-process batch-1 p50)        <= 10
  mlp_c32_cost_ratio    = (1 / sluice mlp req/s) / (1 / echo calls/s + in-process
                          time per row at the batch the server formed)                 <= 1.15
  convnet_c32_over_c8   = convnet req/s at 32 / at 8                                   >= 1.0
  convnet_vs_inprocess  = convnet req/s at 32 / in-process rows/s at its best batch    >= 0.9
--callgrind adds request_path_benchmark's instruction count: sluice-server under valgrind's
callgrind, every thread, --callgrind-requests requests (default 2,000) one at a time after 200 of
warm-up, on its addsub and mlp (about 6 min more on 2 cores).
A window whose load client used more than 75 % of its CPU is marked invalid (the client, not the
server, may have set the pace). Prints a table and writes JSON. --smoke (the test command):
one repetition of tiny windows, no targets; exits non-zero if any call fails; its numbers mean
nothing.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from harness.bench import (ROOT, make_repository as make_bundled, pinning, statistics as model_counts,  # noqa: E402
                                write_json)
from request_path_benchmark import BenchmarkError, Server, callgrind_run, make_repository as make_trivial  # noqa: E402
from harness.process import cpu_seconds  # noqa: E402

FIXED_RATE = 2000  # calls/s for the CPU-per-call windows: below every saturation measured here
CLIENT_BUSY_LIMIT = 0.75
TARGETS = {  # key: (limit, higher is better)
    "mlp_c1_overhead_us": (10.0, False),
    "mlp_c32_cost_ratio": (1.15, False),
    "convnet_c32_over_c8": (1.0, True),
    "convnet_vs_inprocess": (0.9, True),
}
MODEL_ROWS = {"mlp": [784], "convnet": [3, 32, 32]}
# Figures read straight from a window's medians: figure -> (window, field).
WINDOW_FIGURES = {
    "echo_callback_c1_p50_us": ("echo_callback_c1", "p50_us"),
    "echo_cq_c1_p50_us": ("echo_cq_c1", "p50_us"),
    "echo_callback_c32_per_s": ("echo_callback_c32", "calls_per_s"),
    "echo_cq_c32_per_s": ("echo_cq_c32", "calls_per_s"),
    "echo_callback_cpu_us": ("echo_callback_fixed", "server_cpu_us_per_call"),
    "echo_cq_cpu_us": ("echo_cq_fixed", "server_cpu_us_per_call"),
    "mlp_c1_p50_us": ("sluice_mlp_c1", "p50_us"),
    "mlp_c32_per_s": ("sluice_mlp_c32", "calls_per_s"),
    "mlp_c32_avg_batch": ("sluice_mlp_c32", "avg_batch"),
    "mlp_cpu_us": ("sluice_mlp_fixed", "server_cpu_us_per_call"),
    "addsub_c1_p50_us": ("sluice_addsub_c1", "p50_us"),
    "addsub_cpu_us": ("sluice_addsub_fixed", "server_cpu_us_per_call"),
    "convnet_c8_per_s": ("sluice_convnet_c8", "calls_per_s"),
    "convnet_c32_per_s": ("sluice_convnet_c32", "calls_per_s"),
    "convnet_every_size_c8_per_s": ("sluice_convnet_every_size_c8", "calls_per_s"),
    "convnet_every_size_c32_per_s": ("sluice_convnet_every_size_c32", "calls_per_s"),
}


def request_bytes(model):
    """A serialized ModelInferRequest of one row for `model`, with raw input contents."""
    import numpy as np
    from tritonclient.grpc import service_pb2
    rng = np.random.default_rng(7)
    request = service_pb2.ModelInferRequest(model_name=model)
    if model == "addsub":
        for name in ("INPUT0", "INPUT1"):
            request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
            request.raw_input_contents.append(rng.integers(0, 100, (1, 16), dtype=np.int32).tobytes())
    else:
        name, rows = ("INPUT__0", MODEL_ROWS["mlp"]) if model == "mlp" else ("image", MODEL_ROWS["convnet"])
        request.inputs.add(name=name, datatype="FP32", shape=[1, *rows])
        request.raw_input_contents.append(rng.random((1, *rows), dtype=np.float32).tobytes())
    return request.SerializeToString()


def write_request_files(workdir, models):
    """{model: path} of one serialized request (request_bytes) per model, written in `workdir`."""
    files = {}
    for model in models:
        files[model] = os.path.join(workdir, f"{model}.request")
        with open(files[model], "wb") as f:
            f.write(request_bytes(model))
    return files


def make_mlp_addsub(workdir):
    """(repository, request files) with the bundled MLP and the trivial addsub model: what the
    A/B and the profile measure."""
    repository = os.path.join(workdir, "repository")
    make_bundled(repository, True, ["mlp"])
    make_trivial(repository, models=("addsub",))
    return repository, write_request_files(workdir, ("mlp", "addsub"))


def thread_counters(pid):
    """{thread id: (name, voluntary context switches, involuntary ones, CPU seconds)} of every
    thread of process `pid` now (/proc/<pid>/task/*/status and stat)."""
    counters = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        counters[tid] = (status["Name"].strip(), int(status["voluntary_ctxt_switches"]),
                         int(status["nonvoluntary_ctxt_switches"]),
                         (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    return counters


def thread_group(name):
    """The group a server thread's counters are reported under."""
    if name.startswith("sluice-worker"):
        return "worker"
    if name in ("sluice-batcher", "sluice-sequence"):
        return "batcher"
    return "gRPC and the rest"


def per_call_counters(before, after, calls):
    """Context switches and CPU per call between two thread_counters() readings, in total and by
    thread group (threads that ended in between are not counted)."""
    totals = {"voluntary": 0.0, "involuntary": 0.0, "cpu_us": 0.0}
    groups = {}
    for tid, (name, voluntary, involuntary, cpu) in after.items():
        if tid not in before:
            continue
        _, voluntary0, involuntary0, cpu0 = before[tid]
        delta = {"voluntary": (voluntary - voluntary0) / calls, "involuntary": (involuntary - involuntary0) / calls,
                 "cpu_us": (cpu - cpu0) / calls * 1e6}
        group = groups.setdefault(thread_group(name), {"voluntary": 0.0, "involuntary": 0.0, "cpu_us": 0.0})
        for key, value in delta.items():
            group[key] += value
            totals[key] += value
    return totals, groups


class Load:
    """Runs sluice-bench-load windows against one server."""

    def __init__(self, bin_dir, client_prefix, workdir, windows, timeout=None):
        """`timeout`: seconds one client run may take (default: generous for the window); the GPU
        kit keeps it below its step's cap."""
        self.binary = os.path.join(bin_dir, "sluice-bench-load")
        self.prefix = client_prefix
        self.workdir = workdir
        self.warmup_s, self.seconds = windows
        self.timeout = timeout or 120 + self.seconds * 4

    def run(self, url, request_file, concurrency, rate=0, server_pid=None, extra=()):
        """One client run (`extra`: more sluice-bench-load flags); its JSON, with the server's CPU
        and context switches per call when `server_pid` is given."""
        command = [*self.prefix, self.binary, "--target", url, "--request-file", request_file,
                   "--concurrency", str(concurrency), "--rate", str(rate),
                   "--warmup-seconds", str(self.warmup_s), "--seconds", str(self.seconds), *extra]
        # The server's CPU time over the whole client run (warm-up included) is divided by the
        # calls sent in it: at a fixed rate that is the measured calls x (warm-up + window) / window.
        before = cpu_seconds(server_pid) if server_pid else None
        threads_before = thread_counters(server_pid) if server_pid else None
        result = subprocess.run(command, capture_output=True, text=True, timeout=self.timeout)
        after = cpu_seconds(server_pid) if server_pid else None
        threads_after = thread_counters(server_pid) if server_pid else None
        try:
            out = json.loads(result.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            raise BenchmarkError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        if result.returncode != 0 or out["errors"]:
            raise BenchmarkError(f"{' '.join(command)}: {out['errors']} failed calls, first: {out['first_error']}")
        out["valid"] = out["client_cpu_busy"] <= CLIENT_BUSY_LIMIT
        if server_pid:
            # Calls in warm-up and window: at a fixed rate the rate's; closed loop, the window's
            # pace over both.
            sent = (rate or out["calls_per_s"]) * (self.warmup_s + out["seconds"])
            if sent <= 0:
                # No call finished in the window (a smoke run's tiny window on a loaded machine):
                # nothing to divide by; the figures read as NaN rather than fail the run.
                sent = float("nan")
            out["server_cpu_us_per_call"] = (after - before) / sent * 1e6
            totals, groups = per_call_counters(threads_before, threads_after, sent)
            out["server_voluntary_switches_per_call"] = totals["voluntary"]
            out["server_involuntary_switches_per_call"] = totals["involuntary"]
            out["server_threads_per_call"] = groups
        return out


class EchoServer:
    def __init__(self, bin_dir, api, prefix):
        self.command = [*prefix, os.path.join(bin_dir, "sluice-bench-echo"), "--api", api]

    def __enter__(self):
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        if not line.startswith("listening on "):
            self.process.kill()
            raise BenchmarkError(f"{' '.join(self.command)} did not start: {line!r}")
        self.url = f"127.0.0.1:{int(line.split()[-1])}"
        return self

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(timeout=10)
        return False


def measure_echo(bin_dir, api, prefixes, load, request_file, result):
    with EchoServer(bin_dir, api, prefixes[0]) as echo:
        result.setdefault(f"echo_{api}_c1", []).append(load.run(echo.url, request_file, 1))
        result.setdefault(f"echo_{api}_c32", []).append(load.run(echo.url, request_file, 32))
        result.setdefault(f"echo_{api}_fixed", []).append(
            load.run(echo.url, request_file, 32, rate=FIXED_RATE, server_pid=echo.process.pid))


def measure_sluice(bin_dir, repository, prefixes, load, request_files, workdir, rep, result):
    log = os.path.join(workdir, f"sluice_{rep}.log")
    with Server(os.path.join(bin_dir, "sluice-server"), repository, log, prefix=prefixes[0]) as server:
        pid = server.process.pid  # taskset execs: the pid is the server's
        result.setdefault("sluice_mlp_c1", []).append(load.run(server.url, request_files["mlp"], 1))
        before = model_counts(server.url, "mlp")
        run = load.run(server.url, request_files["mlp"], 32)
        after = model_counts(server.url, "mlp")
        executions = after[1] - before[1]
        run["avg_batch"] = (after[0] - before[0]) / executions if executions else 0.0
        result.setdefault("sluice_mlp_c32", []).append(run)
        result.setdefault("sluice_mlp_fixed", []).append(
            load.run(server.url, request_files["mlp"], 32, rate=FIXED_RATE, server_pid=pid))
        result.setdefault("sluice_addsub_c1", []).append(load.run(server.url, request_files["addsub"], 1))
        result.setdefault("sluice_addsub_fixed", []).append(
            load.run(server.url, request_files["addsub"], 32, rate=FIXED_RATE, server_pid=pid))
        result.setdefault("sluice_convnet_c8", []).append(load.run(server.url, request_files["convnet"], 8))
        result.setdefault("sluice_convnet_c32", []).append(load.run(server.url, request_files["convnet"], 32))
        for concurrency in (8, 32):
            result.setdefault(f"sluice_convnet_every_size_c{concurrency}", []).append(
                load.run(server.url, request_files["convnet_every_size"], concurrency))
        result.setdefault("auto_batch_sizes", []).append(chosen_batch_sizes(server.url))


def chosen_batch_sizes(url):
    """{model: (sizes, rows/s per size)} from the ModelConfig answers (sluice.auto_batch_sizes)."""
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(url=url)
    try:
        chosen = {}
        for model in ("mlp", "convnet", "addsub"):
            parameters = client.get_model_config(model).config.parameters
            chosen[model] = [parameters[key].string_value if key in parameters else "" for key in
                             ("sluice.auto_batch_sizes.chosen", "sluice.auto_batch_sizes.rows_per_second")]
        return chosen
    finally:
        client.close()


def inprocess(bin_dir, repository, prefix, smoke, models=("mlp", "convnet"), device="cpu", seconds=0.5,
              via_runtime=False):
    """{model: {batch: sluice-bench-inprocess's row}} for `models` of `repository`, `seconds` per
    batch size (smoke: 0.05) on `device`. `via_runtime`: each pass includes the copies from the
    runtime's host staging to the device and back, as the server's batches do on a GPU."""
    rows = {}
    for model, sizes in (("mlp", [1, 2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 32, 48, 64]),
                         ("convnet", list(range(1, 33)))):
        if model not in models:
            continue
        if smoke:
            sizes = [1, 2]
        out = subprocess.run(
            [*prefix, os.path.join(bin_dir, "sluice-bench-inprocess"), "--model",
             os.path.join(repository, model, "1", "model.pt"), "--row-shape", ",".join(map(str, MODEL_ROWS[model])),
             "--batch-sizes", ",".join(map(str, sizes)), "--seconds", "0.05" if smoke else str(seconds),
             "--threads", "1", "--worker-thread", "true", "--device", device,
             "--via-sluice-runtime", "true" if via_runtime else "false"],
            check=True, capture_output=True, text=True).stdout
        rows[model] = {row["batch"]: row for row in map(json.loads, out.splitlines())}
    return rows


def median(runs, key):
    return statistics.median(run[key] for run in runs)


def summarize(result, inproc):
    """The figures and target ratios from the medians."""
    s = {}
    for key, runs in result.items():
        if key == "auto_batch_sizes":
            continue
        s[key] = {"p50_us": median(runs, "p50_us"), "calls_per_s": median(runs, "calls_per_s"),
                  "client_cpu_busy": max(run["client_cpu_busy"] for run in runs),
                  "valid": all(run["valid"] for run in runs)}
        if "server_cpu_us_per_call" in runs[0]:
            s[key]["server_cpu_us_per_call"] = median(runs, "server_cpu_us_per_call")
        if "avg_batch" in runs[0]:
            s[key]["avg_batch"] = median(runs, "avg_batch")
    figures = {figure: s[window][field] for figure, (window, field) in WINDOW_FIGURES.items()}
    mlp = inproc["mlp"]
    b1_p50 = mlp[1]["p50_us"]
    nearest = min(mlp, key=lambda b: abs(b - figures["mlp_c32_avg_batch"]))
    per_row_us = 1e6 / mlp[nearest]["rows_per_s"]
    conv = inproc["convnet"]
    best_batch = max(conv, key=lambda b: conv[b]["rows_per_s"])
    figures.update({
        "inprocess_mlp_b1_p50_us": b1_p50,
        "inprocess_mlp_us_per_row_at_formed_batch": per_row_us,
        "inprocess_convnet_best_rows_per_s": conv[best_batch]["rows_per_s"],
        "inprocess_convnet_best_batch": best_batch,
    })
    def ratio(a, b):
        # A smoke run's window can end before a slow model answers at all (0/s on a loaded
        # machine): its figures mean nothing, and a ratio of them is NaN rather than a crash.
        return a / b if b else float("nan")

    echo_cost_us = ratio(1e6, figures["echo_callback_c32_per_s"])
    figures.update({
        "mlp_c1_overhead_us": figures["mlp_c1_p50_us"] - (figures["echo_callback_c1_p50_us"] + b1_p50),
        "mlp_c32_cost_ratio": ratio(ratio(1e6, figures["mlp_c32_per_s"]), echo_cost_us + per_row_us),
        "convnet_c32_over_c8": ratio(figures["convnet_c32_per_s"], figures["convnet_c8_per_s"]),
        "convnet_vs_inprocess": ratio(figures["convnet_c32_per_s"], figures["inprocess_convnet_best_rows_per_s"]),
    })
    return s, figures


def target_met(key, value):
    limit, higher = TARGETS[key]
    return value >= limit if higher else value <= limit


def print_table(windows, figures, pin_note):
    print(f"\npinning: {pin_note}")
    print(f"\n{'window':28} {'p50 us':>10} {'calls/s':>10} {'srv CPU us':>11} {'batch':>6} {'client':>7}")
    for key, row in windows.items():
        cpu = row.get("server_cpu_us_per_call")
        batch = row.get("avg_batch")
        print(f"{key:28} {row['p50_us']:10.1f} {row['calls_per_s']:10.0f} "
              f"{'' if cpu is None else f'{cpu:11.1f}':>11} {'' if batch is None else f'{batch:6.1f}':>6} "
              f"{row['client_cpu_busy']:6.0%}{'' if row['valid'] else ' INVALID'}")
    print(f"\n{'target':24} {'value':>9} {'limit':>8}  met")
    for key, (limit, higher) in TARGETS.items():
        value = figures[key]
        print(f"{key:24} {value:9.2f} {('>= ' if higher else '<= ') + str(limit):>8}  "
              f"{'yes' if target_met(key, value) else 'NO'}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per window")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--callgrind", action="store_true", help="also count instructions per request")
    parser.add_argument("--callgrind-requests", type=int, default=2000)
    parser.add_argument("--json")
    args = parser.parse_args()
    reps = 1 if args.smoke else args.reps
    windows = (0.1, 0.3) if args.smoke else (1.0, args.seconds)
    (server_prefix, client_prefix), pin_note = pinning(not args.no_pin)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sluice-floor-") as workdir:
        repository = os.path.join(workdir, "repository")
        make_bundled(repository, True, ["mlp", "convnet"])
        make_trivial(repository, models=("addsub",))
        every_size = os.path.join(repository, "convnet_every_size")
        shutil.copytree(os.path.join(repository, "convnet"), every_size)
        with open(os.path.join(every_size, "config.pbtxt")) as f:
            config = f.read().replace('name: "convnet"', 'name: "convnet_every_size"')
        with open(os.path.join(every_size, "config.pbtxt"), "w") as f:
            f.write(config + '\nparameters { key: "sluice.auto_batch_sizes" value { string_value: "false" } }\n')
        request_files = write_request_files(workdir, ("mlp", "convnet", "convnet_every_size", "addsub"))
        load = Load(args.bin_dir, client_prefix, workdir, windows)
        result = {}
        try:
            inproc = inprocess(args.bin_dir, repository, server_prefix, args.smoke)
            for rep in range(reps):
                sides = ["echo", "sluice"] if rep % 2 == 0 else ["sluice", "echo"]
                for side in sides:
                    if side == "echo":
                        for api in ("callback", "cq"):
                            measure_echo(args.bin_dir, api, (server_prefix, client_prefix), load,
                                         request_files["mlp"], result)
                    else:
                        measure_sluice(args.bin_dir, repository, (server_prefix, client_prefix), load,
                                       request_files, workdir, rep, result)
            if args.callgrind:
                trivial = os.path.join(workdir, "callgrind_repository")
                make_trivial(trivial, models=("addsub", "mlp"))
                callgrind = callgrind_run(os.path.join(args.bin_dir, "sluice-server"), trivial,
                                          args.callgrind_requests, 200, 1, workdir, "callgrind",
                                          (server_prefix, client_prefix), 600)
        except BenchmarkError as error:
            print(f"floor benchmark failed: {error}", file=sys.stderr)
            return 1
    summary, figures = summarize(result, inproc)
    print_table(summary, figures, pin_note)
    print("\nbatch sizes chosen by warm-up (sluice.auto_batch_sizes), per repetition:")
    for chosen in result["auto_batch_sizes"]:
        print("  " + "; ".join(f"{model} {sizes}" for model, (sizes, _) in chosen.items()))
    if args.callgrind:
        figures["addsub_ir_per_request"] = callgrind["addsub_ir_per_request"]
        figures["mlp_ir_per_request"] = callgrind["mlp_ir_per_request"]
        print(f"\ncallgrind, instructions per request: addsub {figures['addsub_ir_per_request']:,.0f}, "
              f"mlp {figures['mlp_ir_per_request']:,.0f}")
    report = {
        "benchmark": "floor", "smoke": args.smoke, "pinning": pin_note, "reps": reps,
        "window_seconds": windows[1], "fixed_rate": FIXED_RATE, "windows": summary, "figures": figures,
        "targets": {key: {"limit": limit, "higher_is_better": higher,
                          "met": target_met(key, figures[key])}
                    for key, (limit, higher) in TARGETS.items()},
        "inprocess": {model: {str(b): row for b, row in rows.items()} for model, rows in inproc.items()},
        "auto_batch_sizes": result["auto_batch_sizes"],
        "invalid_windows": [key for key, row in summary.items() if not row["valid"]],
        "elapsed_s": time.monotonic() - started,
    }
    if args.json:
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
