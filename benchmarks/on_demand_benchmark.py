#!/usr/bin/env python3
"""Many models, a memory budget for a few: loading on demand and least-recently-used eviction
under Zipf-distributed traffic at a fixed rate. Prints a table and writes JSON.

    .venv/bin/python benchmarks/on_demand_benchmark.py [--models 20] [--fit 5] [--rate 30]
        [--seconds 60] [--zipf 1.1] [--min-residency-secs S] [--json out.json]
    .venv/bin/python benchmarks/on_demand_benchmark.py --smoke --bin-dir build/bin --json out.json

The repository holds --models copies of the bundled MLP (784-512-512-10), half as TorchScript
files ("ts00", "ts02", ...) and half as CPU AOTInductor packages ("pt01", "pt03", ...), one CPU
instance each, max_batch_size 8 (warm-up runs every batch size before a load is ready: the
bundled 64 take 1.4 s here, and a cold start waits for all of it). The server runs with
--model-load-on-demand, --model-load-host-limit set to hold --fit of them, and its default
--model-min-residency-secs unless --min-residency-secs is given.

1. Probe: a server without a budget loads four models one after the other and reports what each
   measured (sluice_model_memory_bytes). The first load also pays the process's one-time costs;
   the budget is those costs plus --fit times the larger of a TorchScript and a .pt2 model.
2. Run: Poisson arrivals at --rate requests/s for --seconds, each for a model drawn from a Zipf
   distribution (exponent --zipf) over the models in a shuffled order (seeded), from one client
   (tritonclient's gRPC async_infer, open loop). Server and client are pinned to different CPUs
   (--no-pin: not). Every 100 ms the server's sluice_model_memory_resident_bytes and its RSS are
   sampled.

Per format and in all: requests, answered/s, failures by code, hit rate (requests answered
without waiting for a load / answered), cold starts and their p50/p99 (the server's
sluice_model_cold_start_seconds, request arrival to answer, interpolated within the histogram's
buckets as Prometheus's histogram_quantile does), loads and evictions; the peak of the sampled
resident model memory against the budget, and the server's peak RSS. For scale, the hit rate an
LRU cache of --fit models would reach on the same request sequence if loads took no time. --smoke (the test command's
check that the script runs): four models, a budget for two, two seconds; its numbers mean
nothing.
"""
import argparse
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from harness.bench import ROOT, pinning, write_json  # noqa: E402
from harness.process import rss_bytes  # noqa: E402
from harness.repository import write_bundled  # noqa: E402
from harness.server import metric_value  # noqa: E402
from request_path_benchmark import BenchmarkError, Server  # noqa: E402

FORMATS = {"ts": ("mlp", "model.pt"), "pt": ("mlp_aoti", "model.cpu.pt2")}
MAX_BATCH = 8


def model_names(count, formats=("ts", "pt")):
    return [f"{formats[i % len(formats)]}{i:02d}" for i in range(count)]


def write_repository(root, names, device="cpu"):
    """The models `names` (model_names), each a copy of the bundled MLP in its format, with one
    instance on `device` (cpu, or cuda: KIND_GPU)."""
    formats = sorted({name[:2] for name in names})
    bundled = write_bundled(os.path.join(root, "bundled"), [FORMATS[f][0] for f in formats])
    repository = os.path.join(root, "repository")
    kind = "KIND_CPU" if device == "cpu" else "KIND_GPU"
    for name in names:
        base, filename = FORMATS[name[:2]]
        with open(os.path.join(bundled, base, "config.pbtxt")) as f:
            config = f.read()
        config = re.sub(r'^name: "\w+"', f'name: "{name}"', config, flags=re.M)
        config = re.sub(r"kind: KIND_\w+", f"kind: {kind}", config)
        # Batches up to 8: warm-up runs every batch size before a load is ready (64 sizes take
        # 1.4 s on this machine, the load itself 15 ms), and a cold start waits for all of it.
        config = re.sub(r"max_batch_size: \d+", f"max_batch_size: {MAX_BATCH}", config)
        config += '\nparameters { key: "INTRA_OP_THREAD_COUNT" value { string_value: "1" } }\n'
        os.makedirs(os.path.join(repository, name, "1"))
        with open(os.path.join(repository, name, "config.pbtxt"), "w") as f:
            f.write(config)
        shutil.copyfile(os.path.join(bundled, base, "1", filename), os.path.join(repository, name, "1", filename))
    return repository


def infer_inputs():
    import numpy as np
    import tritonclient.grpc as grpcclient
    inputs = [grpcclient.InferInput("INPUT__0", [1, 784], "FP32")]
    inputs[0].set_data_from_numpy(np.full((1, 784), 0.5, dtype=np.float32))
    return inputs


def memory_of(text, name, device):
    return metric_value(text, f'sluice_model_memory_bytes{{device="{device}",model="{name}",version="1"}}')


def probe(binary, repository, workdir, names, device):
    """What models measure on the budgeted device: (one-time costs of the first load, bytes of
    the largest model)."""
    import tritonclient.grpc as grpcclient
    order = [names[0], names[2], names[1], names[3]]  # with two formats: ts, ts, pt, pt
    with Server(binary, repository, os.path.join(workdir, "probe.log"), device=device,
                extra_args=["--model-control-mode", "explicit", "--model-load-on-demand", "true"]) as server:
        client = grpcclient.InferenceServerClient(server.url)
        for name in order:
            client.infer(name, infer_inputs())
        client.close()
        text = server.metrics_text()
    measured = {name: memory_of(text, name, budget_device(device)) for name in order}
    if any(value is None for value in measured.values()):
        raise BenchmarkError(f"no memory measured for some of {measured}")
    typical = max(measured[names[2]], measured[names[3]])
    first_costs = max(0.0, measured[names[0]] - measured[names[2]])
    return first_costs, typical, measured


def budget_device(device):
    return "cpu" if device == "cpu" else "cuda:0"


def budget_args(device, budget):
    """The server's budget flag: bytes for the host, Triton's fraction of GPU 0's memory for a GPU."""
    if device == "cpu":
        return ["--model-load-host-limit", str(int(budget))]
    import torch
    total = torch.cuda.get_device_properties(0).total_memory
    return ["--model-load-gpu-limit", f"0:{budget / total:.9f}"]


def zipf_weights(count, exponent):
    return [1.0 / (rank + 1) ** exponent for rank in range(count)]


def run(binary, repository, workdir, names, budget, args, prefixes, device):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException
    rng = random.Random(args.seed)
    ranked = names[:]
    rng.shuffle(ranked)
    weights = zipf_weights(len(ranked), args.zipf)
    server_args = ["--model-control-mode", "explicit", "--model-load-on-demand", "true",
                   *budget_args(device, budget)]
    if args.min_residency_secs is not None:
        server_args += ["--model-min-residency-secs", str(args.min_residency_secs)]
    records, lock, samples, sent_names = [], threading.Lock(), [], []
    with Server(binary, repository, os.path.join(workdir, "run.log"), prefix=prefixes[0], device=device,
                extra_args=server_args) as server:
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                try:
                    resident = metric_value(server.metrics_text(),
                                            f'sluice_model_memory_resident_bytes{{device="{budget_device(device)}"}}')
                    samples.append((resident or 0.0, rss_bytes(server.process.pid)))
                except OSError:
                    pass
                time.sleep(0.1)

        sampler = threading.Thread(target=sample)
        sampler.start()
        if prefixes[1]:
            os.sched_setaffinity(0, {int(prefixes[1][-1])})
        client = grpcclient.InferenceServerClient(server.url)
        inputs = infer_inputs()
        started = time.monotonic()
        next_send = started
        sent = 0
        while next_send < started + args.seconds:
            now = time.monotonic()
            if next_send > now:
                time.sleep(next_send - now)
            name = rng.choices(ranked, weights)[0]
            sent_at = time.monotonic()

            def done(result, error, name=name, sent_at=sent_at):
                with lock:
                    records.append((name, time.monotonic() - sent_at,
                                    None if error is None else str(error.status() if isinstance(
                                        error, InferenceServerException) else error)))

            client.async_infer(name, inputs, done, client_timeout=60)
            sent_names.append(name)
            sent += 1
            next_send += rng.expovariate(args.rate)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with lock:
                if len(records) >= sent:
                    break
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        client.close()
        stop.set()
        sampler.join()
        text = server.metrics_text()
    return records, sent_names, elapsed, samples, text, ranked


def lru_hit_rate(sequence, capacity):
    """The hit rate of an LRU cache of `capacity` models on `sequence` with instant loads: what
    the budget allows at best when every load takes no time."""
    cache, hits = [], 0
    for name in sequence:
        if name in cache:
            hits += 1
            cache.remove(name)
        elif len(cache) >= capacity:
            cache.pop(0)
        cache.append(name)
    return hits / len(sequence) if sequence else None


def histogram_quantile(q, buckets):
    """Prometheus's histogram_quantile over [(upper bound, cumulative count)]: None when empty."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = upper, count
    return lower


def cold_buckets(text, names):
    """Summed cumulative buckets of sluice_model_cold_start_seconds over `names`."""
    summed = {}
    for line in text.splitlines():
        if not line.startswith("sluice_model_cold_start_seconds_bucket{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line[:line.rindex("}")]))
        if labels.get("model") in names:
            bound = float("inf") if labels["le"] == "+Inf" else float(labels["le"])
            summed[bound] = summed.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    return list(summed.items())


def summarize(records, elapsed, text, names):
    picked = [record for record in records if record[0] in names]
    answered = [record for record in picked if record[2] is None]
    failures = {}
    for _, _, error in picked:
        if error is not None:
            code = error.split(" ")[0][:40]
            failures[code] = failures.get(code, 0) + 1
    cold = sum(metric_value(text, f'sluice_model_cold_start_seconds_count{{model="{name}"}}') or 0 for name in names)
    buckets = cold_buckets(text, names)
    p50, p99 = histogram_quantile(0.5, buckets), histogram_quantile(0.99, buckets)
    loads = sum(metric_value(text, f'sluice_model_loads_total{{model="{name}",result="ok",trigger="on_demand"}}') or 0
                for name in names)
    evictions = sum(metric_value(text, f'sluice_model_evictions_total{{model="{name}"}}') or 0 for name in names)
    load_seconds = [metric_value(text, f'sluice_model_load_seconds{{model="{name}",version="1"}}') for name in names]
    load_seconds = [value for value in load_seconds if value is not None]
    latencies = sorted(record[1] for record in answered)
    return {
        "requests": len(picked),
        "answered_per_s": len(answered) / elapsed if elapsed else 0.0,
        "failures": failures,
        "hit_rate": (1 - cold / len(answered)) if answered else None,
        "cold_starts": int(cold),
        "cold_start_p50_ms": None if p50 is None else p50 * 1e3,
        "cold_start_p99_ms": None if p99 is None else p99 * 1e3,
        "client_p50_ms": statistics.median(latencies) * 1e3 if latencies else None,
        "load_ms_mean": statistics.mean(load_seconds) * 1e3 if load_seconds else None,
        "loads": int(loads),
        "evictions": int(evictions),
    }


def fmt(value, digits=1):
    return "-" if value is None else f"{value:.{digits}f}"


def measure(bin_dir, *, models=20, fit=5, rate=30.0, seconds=60.0, zipf=1.1, seed=7, pin=True, device="cpu",
            formats=("ts", "pt"), min_residency_secs=None):
    """One probe and one run (see the module's text); the report as a dict. The GPU proof kit
    calls it with device "cuda" and TorchScript only (the bundled .pt2 is a CPU package)."""
    binary = os.path.join(bin_dir, "sluice-server")
    prefixes, pin_note = pinning(pin)
    workdir = tempfile.mkdtemp(prefix="sluice-on-demand-")
    options = argparse.Namespace(rate=rate, seconds=seconds, zipf=zipf, seed=seed,
                                 min_residency_secs=min_residency_secs)
    try:
        names = model_names(models, formats)
        repository = write_repository(workdir, names, device)
        first_costs, typical, measured = probe(binary, repository, workdir, names, device)
        budget = first_costs + fit * typical
        records, sent_names, elapsed, samples, text, ranked = run(binary, repository, workdir, names, budget, options,
                                                                  prefixes, device)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    rows = {"all": summarize(records, elapsed, text, set(names))}
    for prefix, label in (("ts", "torchscript"), ("pt", "pt2")):
        if prefix in formats:
            rows[label] = summarize(records, elapsed, text, {n for n in names if n.startswith(prefix)})
    peak_resident = max((sample[0] for sample in samples), default=0.0)
    return {
        "device": device, "models": models, "fit": fit, "rate": rate, "seconds": seconds, "zipf": zipf, "seed": seed,
        "min_residency_secs": min_residency_secs, "pinning": pin_note, "zipf_order": ranked, "probe_bytes": measured, "one_time_bytes": first_costs,
        "model_bytes": typical, "budget_bytes": budget, "sent": len(sent_names), "elapsed_s": elapsed, "rows": rows,
        "ideal_lru_hit_rate": lru_hit_rate(sent_names, int(fit)),
        "peak_resident_bytes": peak_resident, "peak_rss_bytes": max((sample[1] for sample in samples), default=0),
        "samples": len(samples), "within_budget": peak_resident <= budget,
    }


def print_report(report):
    mib = 2 ** 20
    print(f"{report['models']} models on {report['device']}, budget {report['budget_bytes'] / mib:.1f} MiB = one-time "
          f"{report['one_time_bytes'] / mib:.1f} MiB + {report['fit']:g} x {report['model_bytes'] / mib:.1f} MiB; "
          f"Zipf {report['zipf']}, {report['rate']:g} req/s for {report['seconds']:g} s; {report['sent']} sent; "
          f"min residency {report.get('min_residency_secs') or 'the server default'}; "
          f"pinning: {report['pinning']}")
    print(f"{'':12} {'requests':>8} {'answered/s':>10} {'hit rate':>8} {'cold':>5} {'cold p50 ms':>11} "
          f"{'cold p99 ms':>11} {'p50 ms':>7} {'load ms':>7} {'loads':>5} {'evicted':>7}  failures")
    for label, row in report["rows"].items():
        print(f"{label:12} {row['requests']:>8} {row['answered_per_s']:>10.1f} {fmt(row['hit_rate'], 3):>8} "
              f"{row['cold_starts']:>5} {fmt(row['cold_start_p50_ms']):>11} {fmt(row['cold_start_p99_ms']):>11} "
              f"{fmt(row['client_p50_ms'], 2):>7} {fmt(row['load_ms_mean'], 0):>7} {row['loads']:>5} "
              f"{row['evictions']:>7}  {row['failures'] or '-'}")
    print(f"an LRU cache of {report['fit']:g} models with instant loads would hit {fmt(report['ideal_lru_hit_rate'], 3)} "
          "of the same requests")
    print(f"peak resident model memory {report['peak_resident_bytes'] / mib:.1f} MiB of the "
          f"{report['budget_bytes'] / mib:.1f} MiB budget ({'within' if report['within_budget'] else 'OVER'}; "
          f"{report['samples']} samples); server peak RSS {report['peak_rss_bytes'] / mib:.1f} MiB")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--fit", type=float, default=5)
    parser.add_argument("--rate", type=float, default=30.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--min-residency-secs", type=float, default=None,
                        help="--model-min-residency-secs for the server (default: the server's own)")
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", default=os.path.join(ROOT, "docs", "results", "on_demand_benchmark_cpu.json"))
    args = parser.parse_args()
    if args.smoke:
        args.models, args.fit, args.rate, args.seconds = 4, 2, 20.0, 2.0
    if args.models < 4:
        parser.error("--models must be at least 4")
    report = measure(args.bin_dir, models=args.models, fit=args.fit, rate=args.rate, seconds=args.seconds,
                     zipf=args.zipf, seed=args.seed, pin=not args.no_pin,
                     min_residency_secs=args.min_residency_secs)
    report["smoke"] = args.smoke
    print_report(report)
    write_json(args.json, report)
    if not report["within_budget"]:
        raise BenchmarkError("the sampled resident model memory went over the budget")


if __name__ == "__main__":
    try:
        main()
    except BenchmarkError as error:
        print(f"on_demand_benchmark: {error}", file=sys.stderr)
        sys.exit(1)
