#!/usr/bin/env python3
"""Request path, before and after in one run: two sluice-server binaries (--before, e.g. the
previous commit's, and --after, by default <bin-dir>/sluice-server) measured side by side, in
alternation, on identical model repositories.

    .venv/bin/python benchmarks/request_path_benchmark.py --before OLD/sluice-server \\
        [--after NEW/sluice-server] [--quick] [--json out.json]
    .venv/bin/python benchmarks/request_path_benchmark.py --smoke --bin-dir build/bin --json out.json

Models (written into a temporary repository, CPU instances, one each, one intra-op thread,
dynamic_batching on):
  addsub      INT32 INPUT0, INPUT1 [16] -> OUTPUT0 = a + b, OUTPUT1 = a - b; max_batch_size 8
  mlp         the bundled 784-512-512-10 MLP (models/generate_models.py); max_batch_size 64
  big_output  FP32 INPUT0 [4] -> FP32 OUTPUT0 [1048576] (4 MiB per request, a broadcast copy of
              x[:, 0]); max_batch_size 16
Each server gets --device cpu --log-level warn and the metrics endpoint on a free port (metrics
stay on, as deployed); everything else is the default, warm-up included.

1. Instructions per request (valgrind's callgrind, every server thread): the server starts under
   callgrind with instrumentation off (--instr-atstart=no: LibTorch's start-up is slow enough
   uninstrumented); once it is ready and --warm requests per model have run, instrumentation is
   switched on and the counters zeroed (callgrind_control -i on, -z), --requests requests are sent
   one at a time by tritonclient from this process (not counted), and the counts are dumped
   (callgrind_control -d). Ir of that dump / requests, for addsub and mlp: the median of
   --callgrind-rounds such windows (a window in a few counts 10-15 % more on addsub: absl mutex
   spinning, which depends on how valgrind interleaves the threads). One server per side (pinned
   like the others), the same request count on both sides, a repository of addsub and mlp only.
   Under valgrind a server takes about 4 min to become ready on 2 cores (LibTorch's start-up).
2. p50 latency at concurrency 1 (perf_analyzer, sync, -b 1) for addsub and mlp, in microseconds.
3. big_output throughput at concurrency 16 (perf_analyzer --async, -b 1), inferences per second.
For 2 and 3 the server is pinned to one core (taskset) and perf_analyzer to another, so that the
client does not steal the server's core (on 2 cores: server on CPU 0, client on CPU 1; at
concurrency 16 the client decoding 4 MiB responses may be the bottleneck, equally for both
sides). Each repetition starts a fresh server per side; sides alternate (ABBA order) and the
median of the repetitions is reported.

Prints a table (metric | before | after | after/before) and writes JSON. Without --before only the
after column is measured and there are no ratios. --quick: 30 requests per callgrind window, one
repetition, 1 s perf_analyzer windows (about 9 min for both sides on 2 cores; the full run about
15 min). --smoke (the test command): after only, tiny windows, no callgrind, about 20 s; exits
non-zero if any request fails; its numbers mean nothing. Identical binaries measured this way
differ by up to 2 % in Ir/request and up to 10 % in the wall-clock figures on a 2-core VM.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from harness.bench import ROOT, pinning, write_json  # noqa: E402
from harness import callgrind, perf_analyzer as harness_perf_analyzer  # noqa: E402
from harness.server import SluiceServer  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "models"))
from model_cache import cached, source_key  # noqa: E402 (torch-free)

BIG = 1048576  # elements of big_output's OUTPUT0 per request (4 MiB of FP32)
CALLGRIND_MODELS = ("addsub", "mlp")
LATENCY_MODELS = ("addsub", "mlp")
THROUGHPUT_CONCURRENCY = 16
# Table rows: (key, label, higher is better)
METRICS = [
    ("addsub_ir_per_request", "addsub Ir/request (callgrind)", False),
    ("mlp_ir_per_request", "mlp Ir/request (callgrind)", False),
    ("addsub_p50_us", "addsub p50 us (c1)", False),
    ("mlp_p50_us", "mlp p50 us (c1)", False),
    ("big_output_infer_per_s", f"big_output infer/s (c{THROUGHPUT_CONCURRENCY})", True),
]
CPU_INSTANCE = "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
ONE_THREAD = 'parameters { key: "INTRA_OP_THREAD_COUNT" value { string_value: "1" } }\n'


class BenchmarkError(Exception):
    """A failure that ends the run with a message (and a non-zero exit)."""


# ---------------------------------------------------------------------------------------------
# Repository


def trivial_model(name):
    """The TorchScript file of "addsub" or "big_output", built once into .cache/models (again when
    this file or torch changes; models/model_cache.py): a smoke run that finds it there does not
    import torch."""
    def build(path):
        import torch

        class AddSub(torch.nn.Module):
            def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor):
                return INPUT0 + INPUT1, INPUT0 - INPUT1

        class BigOutput(torch.nn.Module):
            def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:
                return INPUT0[:, :1].expand(-1, 1048576).contiguous()

        torch.jit.script({"addsub": AddSub, "big_output": BigOutput}[name]()).save(path)

    return cached(os.path.join(ROOT, ".cache", "models"), f"benchmark_{name}.pt",
                  source_key(os.path.abspath(__file__)), build)


def make_repository(directory, models=("addsub", "mlp", "big_output")):
    def write(name, config, module):
        if name not in models:
            return
        os.makedirs(os.path.join(directory, name, "1"), exist_ok=True)
        with open(os.path.join(directory, name, "config.pbtxt"), "w") as f:
            f.write(config)
        if module is not None:
            shutil.copyfile(trivial_model(module), os.path.join(directory, name, "1", "model.pt"))

    write("addsub",
          'name: "addsub"\nplatform: "pytorch_libtorch"\nmax_batch_size: 8\n'
          'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },\n'
          '        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'
          'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },\n'
          '         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'
          + CPU_INSTANCE + "dynamic_batching { }\n" + ONE_THREAD,
          "addsub")
    write("big_output",
          'name: "big_output"\nplatform: "pytorch_libtorch"\nmax_batch_size: 16\n'
          'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
          f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {BIG} ] }} ]\n'
          + CPU_INSTANCE + "dynamic_batching { }\n" + ONE_THREAD,
          "big_output")

    # The bundled MLP: its config with a CPU instance (whatever kind the bundled one asks for),
    # dynamic batching (unless the bundled config has it already) and one intra-op thread.
    with open(os.path.join(ROOT, "models", "mlp", "config.pbtxt")) as f:
        config = f.read()
    config = re.sub(r"\bKIND_(GPU|AUTO)\b", "KIND_CPU", config)
    if not re.search(r"^\s*dynamic_batching\b", config, re.M):
        config += "\ndynamic_batching { }\n"
    if "INTRA_OP_THREAD_COUNT" not in config:
        config += ONE_THREAD
    write("mlp", config, None)
    if "mlp" not in models:
        return
    subprocess.run([sys.executable, os.path.join(ROOT, "models", "generate_models.py"),
                    "--repository", directory, "--models", "mlp"], check=True, stdout=subprocess.DEVNULL)


# ---------------------------------------------------------------------------------------------
# Servers



def http_off(binary):
    """--allow-http false for a binary that has the HTTP endpoint (an older one, as floor_ab.py may
    run, knows no such flag): the gRPC path is measured alone, and no two servers race for port
    8000."""
    help_text = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60).stdout
    return ["--allow-http", "false"] if "--allow-http" in help_text else []

class Server(SluiceServer):
    """sluice-server (optionally under a prefix: taskset, valgrind) on free ports, on the CPU (or
    `device`), with the HTTP endpoint off; a context manager that waits `ready_timeout` for it to be ready (raising
    BenchmarkError) and stops it (SIGTERM, then SIGKILL) whatever happens. `ready_s`: from its
    start to ready."""

    def __init__(self, binary, repository, log_path, prefix=(), ready_timeout=120.0, extra_args=(), device="cpu"):
        super().__init__(binary, repository, ["--device", device, *http_off(binary), *extra_args],
                         log_path=log_path, prefix=prefix, log_level="warn", http_port=None, new_session=True)
        self.ready_timeout = ready_timeout

    def __enter__(self):
        try:
            return self.start(self.ready_timeout)
        except (RuntimeError, TimeoutError) as error:
            raise BenchmarkError(str(error)) from None


# ---------------------------------------------------------------------------------------------
# Requests through tritonclient (correctness checks, callgrind's load, statistics)


def request_inputs(model, rng):
    """(inputs, check) for one single-row request: check(result) raises when the answer is wrong."""
    import tritonclient.grpc as grpcclient
    if model == "addsub":
        a = rng.integers(-1000, 1000, (1, 16), dtype=np.int32)
        b = rng.integers(-1000, 1000, (1, 16), dtype=np.int32)
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)

        def check(result):
            if not (np.array_equal(result.as_numpy("OUTPUT0"), a + b)
                    and np.array_equal(result.as_numpy("OUTPUT1"), a - b)):
                raise BenchmarkError("addsub answered wrong sums or differences")
    elif model == "mlp":
        x = rng.random((1, 784), dtype=np.float32)
        inputs = [grpcclient.InferInput("INPUT__0", [1, 784], "FP32")]
        inputs[0].set_data_from_numpy(x)

        def check(result):
            out = result.as_numpy("OUTPUT__0")
            if out is None or out.shape != (1, 10) or not np.all(np.isfinite(out)):
                raise BenchmarkError(f"mlp answered {None if out is None else out.shape}, not a finite (1, 10)")
    elif model == "big_output":
        x = rng.random((1, 4), dtype=np.float32)
        inputs = [grpcclient.InferInput("INPUT0", [1, 4], "FP32")]
        inputs[0].set_data_from_numpy(x)

        def check(result):
            out = result.as_numpy("OUTPUT0")
            if out is None or out.shape != (1, BIG) or not np.all(out == x[0, 0]):
                raise BenchmarkError("big_output answered a wrong tensor")
    else:
        raise ValueError(model)
    return inputs, check


def check_answers(url, models):
    """One request per model, answers checked: both binaries must compute the same thing."""
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(url=url)
    try:
        rng = np.random.default_rng(1)
        for model in models:
            inputs, check = request_inputs(model, rng)
            check(client.infer(model, inputs))
    finally:
        client.close()


def counts(url, model):
    """(successful, failed) inference requests of `model` so far (the server's statistics)."""
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(url=url)
    try:
        stats = client.get_inference_statistics(model).model_stats
        success = sum(s.inference_stats.success.count for s in stats)
        fail = sum(s.inference_stats.fail.count for s in stats)
        return success, fail
    finally:
        client.close()


# ---------------------------------------------------------------------------------------------
# perf_analyzer


def perf_analyzer(url, model, concurrency, mode, workdir, tag, client_prefix):
    before = counts(url, model)
    try:
        # --async above 1: one client thread, not 16 competing with each other.
        row = harness_perf_analyzer.run(url, model, concurrency, os.path.join(workdir, f"pa_{tag}_{model}_c{concurrency}.csv"),
                                        smoke=mode == "smoke", asynchronous=concurrency > 1,
                                        interval_ms=1000 if mode == "quick" else 3000,
                                        max_trials=3 if mode == "smoke" else 10, prefix=client_prefix, timeout=600)
    except RuntimeError as error:
        raise BenchmarkError(str(error)) from None
    after = counts(url, model)
    if after[1] != before[1]:
        raise BenchmarkError(f"{after[1] - before[1]} {model} requests failed during perf_analyzer's run")
    if after[0] == before[0]:
        raise BenchmarkError(f"no {model} request succeeded during perf_analyzer's run")
    return {"infer_per_s": float(row["Inferences/Second"]), "p50_us": float(row["p50 latency"]),
            "p99_us": float(row["p99 latency"]), "requests": after[0] - before[0]}


def wall_clock_run(binary, repository, mode, workdir, tag, pin):
    """One fresh server: the latency and throughput figures."""
    server_prefix, client_prefix = pin
    with Server(binary, repository, os.path.join(workdir, f"{tag}.log"), prefix=server_prefix) as server:
        check_answers(server.url, ("addsub", "mlp", "big_output"))
        out = {"ready_s": server.ready_s}
        for model in LATENCY_MODELS:
            row = perf_analyzer(server.url, model, 1, mode, workdir, tag, client_prefix)
            out[f"{model}_p50_us"] = row["p50_us"]
            out[f"{model}_c1_infer_per_s"] = row["infer_per_s"]
        row = perf_analyzer(server.url, "big_output", THROUGHPUT_CONCURRENCY, mode, workdir, tag, client_prefix)
        out["big_output_infer_per_s"] = row["infer_per_s"]
        out["big_output_p50_us"] = row["p50_us"]
    return out


# ---------------------------------------------------------------------------------------------
# callgrind


def callgrind_run(binary, repository, requests, warm, rounds, workdir, tag, pin, ready_timeout):
    """One server under callgrind: instructions per request for each of CALLGRIND_MODELS, the
    median of `rounds` windows of `requests` requests (the models interleaved). Under valgrind the
    threads take turns, and an absl::Mutex held by a thread that lost its turn makes the others
    spin (absl's MutexDelay, UnlockSlow): one window in a few counts 10-15 % more on addsub."""
    import tritonclient.grpc as grpcclient
    server_prefix, _ = pin
    out_prefix = os.path.join(workdir, f"cg_{tag}")
    valgrind = callgrind.command(out_prefix, "--dump-instr=no", "--trace-children=no")
    out = {}
    windows = {model: [] for model in CALLGRIND_MODELS}
    with Server(binary, repository, os.path.join(workdir, f"{tag}.log"), prefix=[*server_prefix, *valgrind],
                ready_timeout=ready_timeout) as server:
        out["ready_s_under_valgrind"] = server.ready_s
        pid = str(server.process.pid)  # taskset and valgrind exec: the pid is the server's
        check_answers(server.url, CALLGRIND_MODELS)
        client = grpcclient.InferenceServerClient(url=server.url)
        try:
            rng = np.random.default_rng(2)
            inputs = {model: request_inputs(model, rng) for model in CALLGRIND_MODELS}
            for model, (tensors, check) in inputs.items():
                for _ in range(warm):
                    check(client.infer(model, tensors))
            for _ in range(rounds):
                for model, (tensors, _) in inputs.items():
                    before = counts(server.url, model)
                    try:
                        counted = callgrind.window(pid, out_prefix,
                                                   lambda: [client.infer(model, tensors) for _ in range(requests)])
                    except RuntimeError as error:
                        raise BenchmarkError(f"{model}: {error}") from None
                    after = counts(server.url, model)
                    if after[1] != before[1] or after[0] - before[0] != requests:
                        raise BenchmarkError(f"{model} under callgrind: {after[0] - before[0]} of {requests} "
                                             f"requests succeeded, {after[1] - before[1]} failed")
                    windows[model].append({**counted, "per_request": counted["instructions"] / requests})
        finally:
            client.close()
    for model, rows in windows.items():
        out[f"{model}_ir_per_request"] = statistics.median(r["per_request"] for r in rows)
        out[f"{model}_ir_windows"] = rows
    return out


# ---------------------------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    parser.add_argument("--before", help="the sluice-server to compare against (omit: the after column only)")
    parser.add_argument("--after", help="the sluice-server under test (default: <bin-dir>/sluice-server)")
    parser.add_argument("--json", default=os.path.join(ROOT, "build", "request_path_benchmark.json"))
    parser.add_argument("--smoke", action="store_true", help="a tiny run that only checks the script works")
    parser.add_argument("--quick", action="store_true",
                        help="a short real run: 30 callgrind requests per window, 1 repetition, 1 s perf_analyzer windows")
    parser.add_argument("--repetitions", type=int, default=3, help="fresh servers per side for the wall-clock figures")
    parser.add_argument("--requests", type=int, default=200, help="requests per model under callgrind")
    parser.add_argument("--warm", type=int, default=20, help="requests per model before callgrind counts")
    parser.add_argument("--callgrind-rounds", type=int, default=3,
                        help="windows of --requests requests per model under callgrind (the median counts)")
    parser.add_argument("--no-callgrind", action="store_true", help="skip the instruction counts")
    parser.add_argument("--no-pin", action="store_true", help="do not pin server and client to different CPUs")
    parser.add_argument("--valgrind-ready-timeout", type=float, default=1200.0,
                        help="seconds a server under valgrind may take to become ready")
    args = parser.parse_args()

    after_binary = os.path.abspath(args.after or os.path.join(args.bin_dir, "sluice-server"))
    before_binary = os.path.abspath(args.before) if args.before and not args.smoke else None
    for binary in filter(None, (after_binary, before_binary)):
        if not os.access(binary, os.X_OK):
            sys.exit(f"request_path_benchmark: {binary} is not an executable sluice-server")
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    repetitions = 1 if mode != "full" else args.repetitions
    requests, warm = (30, 10) if mode == "quick" else (args.requests, args.warm)
    sides = {"before": before_binary, "after": after_binary} if before_binary else {"after": after_binary}
    notes = []
    pin, pin_note = pinning(not args.no_pin)
    if before_binary is None and args.before:
        notes.append("--smoke: --before ignored, the after binary only")

    callgrind = mode != "smoke" and not args.no_callgrind
    if callgrind and (shutil.which("valgrind") is None or shutil.which("callgrind_control") is None):
        callgrind = False
        notes.append("valgrind/callgrind_control not installed: instruction counts skipped")
    elif mode == "smoke":
        notes.append("smoke: no callgrind")
    elif args.no_callgrind:
        notes.append("--no-callgrind: instruction counts skipped")

    try:
        harness_perf_analyzer.path()  # missing: say so now, before any server starts
    except RuntimeError as error:
        sys.exit(f"request_path_benchmark: {error}")

    started = time.monotonic()
    runs = {side: [] for side in sides}
    cg = {}
    workdir = tempfile.mkdtemp(prefix="sluice-request-path-")
    try:
        repository = os.path.join(workdir, "models")
        make_repository(repository)
        # Under callgrind only the models it counts: each loaded model's warm-up costs minutes there.
        callgrind_repository = os.path.join(workdir, "callgrind_models")
        make_repository(callgrind_repository, CALLGRIND_MODELS)
        # Wall-clock figures: fresh servers, sides alternating ABBA (before, after, after, before, ...).
        order = list(sides)
        for rep in range(repetitions):
            for side in (order if rep % 2 == 0 else order[::-1]):
                print(f"[{time.monotonic() - started:6.0f} s] {side}: perf_analyzer, repetition {rep + 1}/{repetitions}",
                      flush=True)
                runs[side].append(wall_clock_run(sides[side], repository, mode, workdir, f"{side}{rep}", pin))
        if callgrind:
            for side in order:
                print(f"[{time.monotonic() - started:6.0f} s] {side}: callgrind, {args.callgrind_rounds} x {requests} "
                      "requests per model",
                      flush=True)
                cg[side] = callgrind_run(sides[side], callgrind_repository, requests, warm, args.callgrind_rounds,
                                         workdir, side, pin,
                                         args.valgrind_ready_timeout)
    except BenchmarkError as error:
        sys.exit(f"request_path_benchmark: {error}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.monotonic() - started

    results = {}
    for side in sides:
        row = {}
        for key in runs[side][0]:
            row[key] = statistics.median(r[key] for r in runs[side])
        row.update(cg.get(side, {}))
        results[side] = row
    ratios = {}
    if "before" in results:
        for key, _, _ in METRICS:
            b, a = results["before"].get(key), results["after"].get(key)
            if b and a is not None:
                ratios[key] = a / b

    print(f"\nRequest path: {mode} run, {repetitions} repetition(s) per side (medians), pinning {pin_note}"
          + (f", callgrind median of {args.callgrind_rounds} x {requests} requests per model" if callgrind else ""))
    print(f"  before: {before_binary or '-'}\n  after:  {after_binary}")
    print(f"{'metric':34} | {'before':>14} | {'after':>14} | {'after/before':>12}")
    print("-" * 34 + "-+-" + "-" * 14 + "-+-" + "-" * 14 + "-+-" + "-" * 12)

    def cell(value):
        return f"{value:14.1f}" if value is not None else f"{'-':>14}"

    for key, label, higher_better in METRICS:
        b = results.get("before", {}).get(key)
        a = results["after"].get(key)
        ratio = f"{ratios[key]:12.4f}" if key in ratios else f"{'-':>12}"
        print(f"{label:34} | {cell(b)} | {cell(a)} | {ratio}")
    print("(Ir and p50: lower is better; infer/s: higher is better)")
    for note in notes:
        print(f"note: {note}")
    print(f"took {elapsed:.0f} s")
    write_json(args.json, {
        "benchmark": "request_path", "before_binary": before_binary, "after_binary": after_binary,
        "smoke": args.smoke, "mode": mode, "repetitions": repetitions,
        "callgrind_requests": requests if callgrind else None,
        "callgrind_rounds": args.callgrind_rounds if callgrind else None,
        "callgrind_warm": warm if callgrind else None,
        "pinning": pin_note, "results": results, "ratios": ratios, "runs": runs, "notes": notes,
        "seconds": elapsed,
    })


if __name__ == "__main__":
    main()
