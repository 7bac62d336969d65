#!/usr/bin/env python3
"""The response cache (response_cache { enable: true }, --cache-config local,size=BYTES) against the
same model without it, at concurrency 16 with 0 %, 50 % and 90 % of the requests repeating an
earlier one, in one run. Prints a table and writes JSON.

    .venv/bin/python benchmarks/response_cache_benchmark.py [--reps 3] [--seconds 3] [--json out.json]
    .venv/bin/python benchmarks/response_cache_benchmark.py --smoke --bin-dir build/bin --json out.json

Per model (the bundled conv net and MLP), one server holds two copies: "<model>_plain" and
"<model>_cached" (response_cache enabled), with a cache of --cache-mib. sluice-bench-load drives
each copy closed-loop at concurrency 16; a call repeats the one fixed request with probability
0, 0.5 or 0.9, and otherwise carries inputs never sent before (--unique-offset), so the hit rate
follows the repeat share. Figures per window: requests/s, p50 and p99 (us), the server's CPU per
request (us), and the hit rate the server's statistics counted. Medians of --reps repetitions,
the two copies alternating within each repetition.

Memory: the server's resident memory after the cached copy's 0 % windows (every request a new
entry, so the cache is full and evicting) against a baseline taken after the same traffic to the
plain copy; the growth should stay within the cache's size plus 10 %.

Targets (issue 35): at 90 % repeats the cache serves at least 3x the requests per second of no
cache; at 0 % it costs at most 5 % of throughput; the memory as above.

The server runs on one CPU and the client on another (--no-pin: both anywhere). --smoke (the test
command's check that the script runs): the MLP at 0 % and 90 %, one repetition, tiny windows; its
numbers mean nothing.
"""
import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import floor_benchmark as fb  # noqa: E402
from harness.bench import ROOT, pinning, write_json  # noqa: E402
from harness.process import rss_bytes  # noqa: E402
from harness.repository import write_bundled  # noqa: E402
from harness.server import metric_value  # noqa: E402
from request_path_benchmark import BenchmarkError, Server  # noqa: E402

MODELS = ("convnet", "mlp")
SHARES = (0.0, 0.5, 0.9)
CONCURRENCY = 16
VARIANTS = ("plain", "cached")


def write_copies(workdir, model):
    """A repository with `model`'s two copies (same file, one config with the cache on)."""
    source = os.path.join(workdir, "bundled")
    write_bundled(source, [model], "dynamic_batching { }")
    with open(os.path.join(source, model, "config.pbtxt")) as f:
        config = f.read()
    repository = os.path.join(workdir, f"repository_{model}")
    for variant in VARIANTS:
        name = f"{model}_{variant}"
        os.makedirs(os.path.join(repository, name, "1"), exist_ok=True)
        text = config.replace(f'name: "{model}"', f'name: "{name}"')
        if variant == "cached":
            text += "\nresponse_cache { enable: true }\n"
        with open(os.path.join(repository, name, "config.pbtxt"), "w") as f:
            f.write(text)
        os.link(os.path.join(source, model, "1", "model.pt"), os.path.join(repository, name, "1", "model.pt"))
    return repository


def request_files(workdir, model):
    """{variant: (path, unique offset)}: one-row requests whose first two input values a unique
    call overwrites (the offset of the raw input bytes in the serialized message)."""
    from tritonclient.grpc import service_pb2
    files = {}
    for variant in VARIANTS:
        request = service_pb2.ModelInferRequest.FromString(fb.request_bytes(model))
        request.model_name = f"{model}_{variant}"
        serialized = request.SerializeToString()
        offset = serialized.find(request.raw_input_contents[0])
        if offset < 0:
            raise BenchmarkError("the input bytes are not found in the serialized request")
        path = os.path.join(workdir, f"{model}_{variant}.request")
        with open(path, "wb") as f:
            f.write(serialized)
        files[variant] = (path, offset)
    return files


def cache_counts(url, model):
    """(hits, misses) of `model` from the server's statistics."""
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(url=url)
    try:
        inference = client.get_inference_statistics(model).model_stats[0].inference_stats
        return inference.cache_hit.count, inference.cache_miss.count
    finally:
        client.close()


def window(load, server, model, variant, files, share):
    path, offset = files[variant]
    name = f"{model}_{variant}"
    before = cache_counts(server.url, name)
    run = load.run(server.url, path, CONCURRENCY, server_pid=server.process.pid,
                   extra=("--unique-offset", str(offset), "--repeat-share", str(share)))
    hits, misses = (after - was for after, was in zip(cache_counts(server.url, name), before))
    run["hit_rate"] = hits / (hits + misses) if hits + misses else 0.0
    return run


def measure_model(model, bin_dir, prefixes, workdir, smoke, *, seconds, warmup, reps, cache_mib, shares=SHARES):
    windows = (0.1, 0.3) if smoke else (warmup, seconds)
    load = fb.Load(bin_dir, prefixes[1], workdir, windows)
    repository = write_copies(workdir, model)
    files = request_files(workdir, model)
    cache_bytes = cache_mib << 20
    shares = (0.0, 0.9) if smoke else shares
    report = {"cache_bytes": cache_bytes, "concurrency": CONCURRENCY, "shares": {}}
    log = os.path.join(workdir, f"{model}_server.log")
    with Server(os.path.join(bin_dir, "sluice-server"), repository, log, prefix=prefixes[0],
                extra_args=["--cache-config", f"local,size={cache_bytes}"]) as server:
        # The same unique traffic to the plain copy first: gRPC's and the allocator's memory at
        # their working size, so that the growth after the cached copy's is the cache's.
        window(load, server, model, "plain", files, 0.0)
        baseline = rss_bytes(server.process.pid)
        raw = {share: {variant: [] for variant in VARIANTS} for share in shares}
        for share in shares:
            for _ in range(1 if smoke else reps):
                for variant in VARIANTS:
                    raw[share][variant].append(window(load, server, model, variant, files, share))
            if share == 0.0:
                text = server.metrics_text()
                report["memory"] = {
                    "baseline_rss_bytes": baseline,
                    "rss_growth_bytes": rss_bytes(server.process.pid) - baseline,
                    "cache_bytes_counted": metric_value(text, "sluice_response_cache_bytes"),
                    "evictions": metric_value(text, "sluice_response_cache_evictions_total"),
                }
        for share in shares:
            figures = {variant: summarize(runs) for variant, runs in raw[share].items()}
            figures["raw"] = raw[share]
            figures["throughput_ratio"] = figures["cached"]["calls_per_s"] / figures["plain"]["calls_per_s"]
            report["shares"][str(share)] = figures
    judge(report)
    return report


def summarize(runs, keys=("calls_per_s", "p50_us", "p99_us", "server_cpu_us_per_call", "hit_rate", "client_cpu_busy")):
    return {key: statistics.median(run[key] for run in runs) for key in keys}


def judge(report):
    met = {}
    if "0.9" in report["shares"]:
        met["3x_at_90%"] = report["shares"]["0.9"]["throughput_ratio"] >= 3.0
    if "0.0" in report["shares"]:
        met["cost_at_most_5%_at_0%"] = report["shares"]["0.0"]["throughput_ratio"] >= 0.95
    memory = report.get("memory")
    if memory:
        met["memory_within_size_plus_10%"] = memory["rss_growth_bytes"] <= 1.1 * report["cache_bytes"]
    report["met"] = met


def print_table(report):
    print(f"\npinning: {report['pinning']}; medians of {report['reps']} repetitions; concurrency {CONCURRENCY}")
    for model, figures in report["models"].items():
        memory = figures.get("memory", {})
        print(f"\n{model}: cache {figures['cache_bytes'] >> 20} MiB; after the 0 % windows: RSS "
              f"+{memory.get('rss_growth_bytes', 0) / 2**20:.1f} MiB, the cache counts "
              f"{(memory.get('cache_bytes_counted') or 0) / 2**20:.1f} MiB, {memory.get('evictions') or 0:.0f} evictions")
        print(f"{'repeats':>7} {'variant':>7} {'req/s':>8} {'p50 us':>8} {'p99 us':>8} {'cpu us/req':>10} {'hits':>5}  cached/plain")
        for share, row in figures["shares"].items():
            for variant in VARIANTS:
                f = row[variant]
                ratio = f"{row['throughput_ratio']:.2f}x" if variant == "cached" else ""
                print(f"{float(share):>7.0%} {variant:>7} {f['calls_per_s']:>8.0f} {f['p50_us']:>8.0f} {f['p99_us']:>8.0f} "
                      f"{f['server_cpu_us_per_call']:>10.0f} {f['hit_rate']:>5.0%}  {ratio}")
        print("targets: " + ", ".join(f"{key}={'yes' if ok else 'NO'}" for key, ok in figures["met"].items()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per window")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each window")
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    parser.add_argument("--cache-mib", type=int, default=16, help="the cache's size")
    parser.add_argument("--shares", nargs="*", type=float, default=list(SHARES),
                        help="repeat shares to measure (an A/B of one share against another build)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin the server and the client to CPUs")
    parser.add_argument("--smoke", action="store_true", help="check that the benchmark runs (numbers mean nothing)")
    parser.add_argument("--json", default=os.path.join(ROOT, "build", "response_cache_benchmark.json"))
    args = parser.parse_args()
    prefixes, pin_note = pinning(not args.no_pin)
    models = ["mlp"] if args.smoke else args.models
    report = {"pinning": pin_note, "reps": 1 if args.smoke else args.reps, "smoke": args.smoke, "models": {}}
    with tempfile.TemporaryDirectory(prefix="sluice-cache-bench-") as workdir:
        for model in models:
            report["models"][model] = measure_model(model, args.bin_dir, prefixes, workdir, args.smoke,
                                                    seconds=args.seconds, warmup=args.warmup, reps=args.reps,
                                                    cache_mib=args.cache_mib, shares=tuple(args.shares))
    print_table(report)
    write_json(args.json, report)


if __name__ == "__main__":
    try:
        main()
    except BenchmarkError as error:
        sys.exit(f"response_cache_benchmark: {error}")
