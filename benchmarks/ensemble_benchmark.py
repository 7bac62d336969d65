#!/usr/bin/env python3
"""An ensemble against the client calling its models in turn: the bundled convnet_pipeline
(image_normaliser -> convnet -> top_classes) as one request, and the same three models called one
after the other by the client, each answer fed into the next request ("chain"), at concurrency 1
and 32, side by side in one run.

    .venv/bin/python benchmarks/ensemble_benchmark.py [--smoke] [--json out.json] [--seconds S]
        [--bin-dir build/bin] [--baseline-bin-dir DIR] [--repetitions N] [--no-pin]

Server and load client are pinned to different CPUs (harness.bench.pinning); the client is this
process, tritonclient over gRPC, one thread per concurrent caller, each sending one image (FP32
[1, 3, 32, 32], 0..255) per request. For each (mode, concurrency) the script reports requests
answered per second (a chain request is its three calls), the median and 99th percentile latency
of one whole request, and the server's CPU time per request (user + system from /proc over the
window). It also counts, over the ensemble's run at the highest concurrency, the convnet's
executions against its inferences: fewer executions than inferences means steps of different
ensemble requests ran in one batch; and, for the ensemble, the bytes of tensors copied between its
steps per request (sluice_ensemble_copied_bytes_total: on the device, through the host).

--baseline-bin-dir DIR runs every row on a second build too (the commit before, built apart), the
builds taking turns for --repetitions rounds; the JSON then has each build's medians and the
current build's throughput and server CPU per request against the baseline's.

Targets (the issue's): the ensemble at least 1.5x the chain's throughput at c=32, and a lower p50
at c=1. Prints a table, writes JSON. --smoke runs concurrency 1 and 4 for a second each, no
targets (the test command runs it so that the script keeps working).
"""
import argparse
import os
import statistics as stats
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from harness.bench import ROOT, model_stats, pinning, start_server, write_bundled, write_json  # noqa: E402
from harness.server import FREE  # noqa: E402

MODELS = ["image_normaliser", "convnet", "top_classes", "convnet_pipeline"]
TARGET_THROUGHPUT_RATIO = 1.5


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_request(client, grpcclient, mode, pixels):
    def call(model, name, value, outputs):
        given = grpcclient.InferInput(name, list(value.shape), "FP32")
        given.set_data_from_numpy(value)
        return client.infer(model, [given], outputs=[grpcclient.InferRequestedOutput(o) for o in outputs])

    if mode == "ensemble":
        result = call("convnet_pipeline", "pixels", pixels, ["scores", "classes"])
        return result.as_numpy("classes")
    image = call("image_normaliser", "pixels", pixels, ["image"]).as_numpy("image")
    logits = call("convnet", "image", image, ["logits"]).as_numpy("logits")
    return call("top_classes", "logits", logits, ["scores", "classes"]).as_numpy("classes")


def copied_bytes(server):
    """sluice_ensemble_copied_bytes_total of the pipeline, by path; {} from a build without it."""
    found = {}
    for line in server.metrics_text().splitlines():
        if line.startswith("sluice_ensemble_copied_bytes_total{") and 'model="convnet_pipeline"' in line:
            found[line.split('path="', 1)[1].split('"', 1)[0]] = float(line.rsplit(" ", 1)[1])
    return found


def run(server, mode, concurrency, seconds):
    url, pid = server.url, server.process.pid
    import tritonclient.grpc as grpcclient
    latencies = []
    lock = threading.Lock()
    stop = threading.Event()
    errors = []

    def caller(index):
        client = grpcclient.InferenceServerClient(url)
        pixels = np.random.default_rng(index).uniform(0, 255, (1, 3, 32, 32)).astype(np.float32)
        try:
            while not stop.is_set():
                started = time.perf_counter()
                one_request(client, grpcclient, mode, pixels)
                took = time.perf_counter() - started
                with lock:
                    latencies.append(took)
        except Exception as error:  # noqa: BLE001: reported below
            errors.append(error)
        finally:
            client.close()

    convnet_before, copies_before = model_stats(url, "convnet"), copied_bytes(server)
    threads = [threading.Thread(target=caller, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    time.sleep(min(1.0, seconds / 4))  # warm: every caller has sent
    with lock:
        latencies.clear()
    cpu_before, started = cpu_seconds(pid), time.perf_counter()
    time.sleep(seconds)
    with lock:
        window = list(latencies)
    cpu_after, elapsed = cpu_seconds(pid), time.perf_counter() - started
    stop.set()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    convnet_after, copies_after = model_stats(url, "convnet"), copied_bytes(server)
    answered = convnet_after.inference_count - convnet_before.inference_count  # every request's
    copies = {path: (copies_after[path] - copies_before.get(path, 0)) / answered if answered else None
              for path in copies_after}
    done = len(window)
    ordered = sorted(window)
    return {
        "mode": mode, "concurrency": concurrency, "requests": done, "seconds": elapsed,
        "requests_per_second": done / elapsed,
        "p50_us": stats.median(window) * 1e6 if window else None,
        "p99_us": ordered[int(0.99 * (done - 1))] * 1e6 if window else None,
        "server_cpu_us_per_request": (cpu_after - cpu_before) / done * 1e6 if done else None,
        "convnet_inferences": convnet_after.inference_count - convnet_before.inference_count,
        "convnet_executions": convnet_after.execution_count - convnet_before.execution_count,
        "copied_on_device_bytes_per_request": copies.get("device") if mode == "ensemble" else None,
        "copied_through_host_bytes_per_request": copies.get("host") if mode == "ensemble" else None,
    }


def median_of(rows, build, mode, concurrency, key):
    values = [row[key] for row in rows if (row["build"], row["mode"], row["concurrency"]) == (build, mode, concurrency)
              and row[key] is not None]
    return stats.median(values) if values else None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    parser.add_argument("--baseline-bin-dir", default=None,
                        help="a second build (the commit before) to run every row on too, taking turns")
    parser.add_argument("--repetitions", type=int, default=1, help="rounds of every row (per build)")
    parser.add_argument("--json", default=os.path.join(ROOT, "build", "ensemble_benchmark.json"))
    parser.add_argument("--smoke", action="store_true", help="a tiny run that only checks the script works")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured window per row")
    parser.add_argument("--no-pin", action="store_true", help="do not pin server and client to CPUs")
    args = parser.parse_args()
    concurrencies = [1, 4] if args.smoke else [1, 32]
    seconds = 1.0 if args.smoke else args.seconds
    builds = [("current", args.bin_dir)] + ([("baseline", args.baseline_bin_dir)] if args.baseline_bin_dir else [])
    (server_prefix, client_prefix), pin_note = pinning(not args.no_pin)
    if client_prefix:
        os.sched_setaffinity(0, {int(client_prefix[-1])})
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        repository = os.path.join(workdir, "models")
        write_bundled(repository, MODELS)
        for repetition in range(args.repetitions):
            for build, bin_dir in builds:
                server = start_server(bin_dir, repository, ["--device", "cpu"], prefix=server_prefix,
                                      metrics_port=FREE)
                try:
                    for concurrency in concurrencies:
                        for mode in ("chain", "ensemble"):
                            row = run(server, mode, concurrency, seconds)
                            row.update(build=build, repetition=repetition)
                            rows.append(row)
                            print(f"  {build:8} {mode:8} c={concurrency:<3} {row['requests_per_second']:8.1f} req/s",
                                  flush=True)
                finally:
                    server.process.terminate()
                    server.process.wait(timeout=30)
    print(f"\nEnsemble (convnet_pipeline, 3 steps) against the client chaining its models; pinning: {pin_note}"
          f"; medians of {args.repetitions} round(s)")
    print(f"{'build':9} {'mode':9} {'c':>3} {'req/s':>9} {'p50 us':>9} {'p99 us':>9} {'server CPU us/req':>18} "
          f"{'copied B/req dev/host':>22}")
    medians = []
    for build, _ in builds:
        for concurrency in concurrencies:
            for mode in ("chain", "ensemble"):
                entry = {"build": build, "mode": mode, "concurrency": concurrency}
                for key in ("requests_per_second", "p50_us", "p99_us", "server_cpu_us_per_request",
                            "copied_on_device_bytes_per_request", "copied_through_host_bytes_per_request"):
                    entry[key] = median_of(rows, build, mode, concurrency, key)
                medians.append(entry)
                copied = ("-" if entry["copied_on_device_bytes_per_request"] is None else
                          f"{entry['copied_on_device_bytes_per_request']:.0f}/"
                          f"{entry['copied_through_host_bytes_per_request']:.0f}")
                print(f"{build:9} {mode:9} {concurrency:3d} {entry['requests_per_second']:9.1f} {entry['p50_us']:9.0f} "
                      f"{entry['p99_us']:9.0f} {entry['server_cpu_us_per_request']:18.0f} {copied:>22}")
    report = {"benchmark": "ensemble", "smoke": args.smoke, "pinning": pin_note, "seconds": seconds,
              "repetitions": args.repetitions, "rows": rows, "medians": medians}

    def current(mode, concurrency, key):
        return median_of(rows, "current", mode, concurrency, key)

    high, low = concurrencies[-1], concurrencies[0]
    ratio = current("ensemble", high, "requests_per_second") / current("chain", high, "requests_per_second")
    p50_ratio = current("ensemble", low, "p50_us") / current("chain", low, "p50_us")
    cpu_ratio = current("ensemble", high, "server_cpu_us_per_request") / current("chain", high, "server_cpu_us_per_request")
    inferences = sum(r["convnet_inferences"] for r in rows if (r["build"], r["mode"], r["concurrency"]) == ("current", "ensemble", high))
    executions = sum(r["convnet_executions"] for r in rows if (r["build"], r["mode"], r["concurrency"]) == ("current", "ensemble", high))
    report.update({"throughput_ratio_high": ratio, "p50_ratio_low": p50_ratio, "server_cpu_ratio_high": cpu_ratio,
                   "steps_batched_together": executions < inferences})
    print(f"\nensemble / chain at c={high}: throughput {ratio:.2f}x (target >= {TARGET_THROUGHPUT_RATIO}), "
          f"server CPU per request {cpu_ratio:.2f}x")
    print(f"ensemble / chain at c={low}: p50 {p50_ratio:.2f}x (target < 1)")
    print(f"convnet at c={high} under the ensemble: {inferences} inferences in {executions} executions")
    if args.baseline_bin_dir:
        against = {}
        for concurrency in concurrencies:
            for mode in ("chain", "ensemble"):
                base = {key: median_of(rows, "baseline", mode, concurrency, key)
                        for key in ("requests_per_second", "server_cpu_us_per_request", "p50_us")}
                now = {key: current(mode, concurrency, key) for key in base}
                against[f"{mode}_c{concurrency}"] = {f"{key}_vs_baseline": now[key] / base[key] for key in base}
                print(f"current / baseline, {mode} c={concurrency}: "
                      + ", ".join(f"{key} {value:.3f}x" for key, value in against[f"{mode}_c{concurrency}"].items()))
        report["vs_baseline"] = against
    if not args.smoke:
        report["targets_met"] = ratio >= TARGET_THROUGHPUT_RATIO and p50_ratio < 1
    write_json(args.json, report)


if __name__ == "__main__":
    main()
