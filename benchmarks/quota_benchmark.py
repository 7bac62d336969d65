#!/usr/bin/env python3
"""Quotas per client under 2x overload: a well-behaved client beside a greedy one, with and
without a quota on the greedy one, and what a refusal costs the server against a served request,
in one run. Prints a table and writes JSON.

    .venv/bin/python benchmarks/quota_benchmark.py [--reps 3] [--seconds 3] [--json out.json]
    .venv/bin/python benchmarks/quota_benchmark.py --smoke --bin-dir build/bin --json out.json

One server ("wideconv": the conv net with 64-channel convolutions, whose capacity compute decides,
dynamic batching, one instance) with client quotas on. Clients are named by the x-client-id
header (the load client's address, 127.0.0.1, is the trusted proxy):
  every client   rate = QUOTA_SHARE x capacity, burst = a tenth of that (--client-quota)
  "free"         no quota (rate=0:free)
  "refused"      one request per 1000 s (every request refused after the first)
First the model's capacity: the highest closed-loop requests/s over concurrencies 8, 32, 64. Then,
per repetition, Poisson open-loop windows (sluice-bench-load, at most 4096 calls in flight):

  unloaded   "good" alone at GOOD_SHARE x capacity
  quota      "good", and at the same time "greedy" at 2x capacity under the every-client quota
  no_quota   "good", and at the same time "free" at 2x capacity (what the quota spares "good")
  refusals   "refused" alone at 2x capacity: the server's CPU per refused request
  served     "free" alone at SERVED_SHARE x capacity: the server's CPU per served request

Per stream: answered/s, p50 and p99 of the answered calls (us), refusals by quota
(RESOURCE_EXHAUSTED) and by a full queue (UNAVAILABLE), and for the CPU windows the server's
utime + stime over the client run divided by the requests sent in it. Medians of --reps.

Targets: under the quota, "good" loses no request and its p99 stays within 1.5x its unloaded p99;
a refused request costs the server at most 10 % of the CPU of a served one.

The server runs on one CPU and the clients on another (--no-pin: anywhere); the CPUs are kept
awake (harness.bench.awake; --no-awake). --smoke (the test command's check that the script runs):
one repetition, tiny windows; its numbers mean nothing.
"""
import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import floor_benchmark as fb  # noqa: E402
from harness.bench import ROOT, awake, pinning, write_json  # noqa: E402
from harness.process import cpu_seconds  # noqa: E402
from harness.repository import write_bundled  # noqa: E402
from latency_target_benchmark import DERIVED, capacity, open_loop  # noqa: E402
from priority_benchmark import together  # noqa: E402
from request_path_benchmark import BenchmarkError, Server  # noqa: E402

MODEL = "wideconv"
GOOD_SHARE = 0.1     # the good client's rate, a share of capacity
QUOTA_SHARE = 0.2    # every client's quota, a share of capacity
OVERLOAD = 2.0       # the greedy client's rate, in capacities
SERVED_SHARE = 0.5   # the rate of the window that measures a served request's CPU
P99_TARGET = 1.5     # good's p99 under the quota over its unloaded p99
CPU_TARGET = 0.10    # CPU per refused request over CPU per served request


def write_repository(workdir):
    base, write_model = DERIVED[MODEL]
    repository = os.path.join(workdir, "repository")
    write_bundled(repository, [base], "dynamic_batching { }")
    write_model(os.path.join(repository, base, "1", "model.pt"))
    return repository, base


def as_client(client):
    return ["--metadata", f"x-client-id={client}"]


def cpu_window(load, url, path, rate, client, seed, pid):
    """One Poisson window of `client` alone: sluice-bench-load's JSON with the server's CPU per
    request sent (warm-up included)."""
    before = cpu_seconds(pid)
    out = open_loop(load, url, path, rate, target_us=0, seed=seed, extra=as_client(client))
    out["server_cpu_us_per_request"] = (cpu_seconds(pid) - before) / (rate * (load.warmup_s + load.seconds)) * 1e6
    return out


def summarize(windows):
    for window in windows:
        window["answered_per_s"] = window["ok"] / window["seconds"] if window["seconds"] else 0.0
    keys = ("sent", "ok", "answered_per_s", "answered_p50_us", "answered_p99_us", "resource_exhausted",
            "unavailable", "deadline_exceeded", "not_sent", "client_cpu_busy", "server_cpu_us_per_request")
    return {key: statistics.median(window[key] for window in windows) for key in keys if key in windows[0]}


def measure(bin_dir, prefixes, workdir, smoke, *, seconds, warmup, reps):
    windows = (0.1, 0.3) if smoke else (warmup, seconds)
    load = fb.Load(bin_dir, prefixes[1], workdir, windows)
    repository, base = write_repository(workdir)
    path = os.path.join(workdir, "wideconv.request")
    with open(path, "wb") as f:
        f.write(fb.request_bytes(base))
    raw = {"unloaded": [], "quota": [], "no_quota": [], "refusals": [], "served": []}
    # The capacity first, on a server without quotas; then the quota server sized from it.
    with Server(os.path.join(bin_dir, "sluice-server"), repository, os.path.join(workdir, "capacity.log"),
                prefix=prefixes[0]) as server:
        cap = capacity(load, server.url, path)
    quota_rate = QUOTA_SHARE * cap
    flags = ["--client-quota", f"rate={quota_rate:.1f},burst={max(2.0, quota_rate / 10):.1f}",
             "--client-quota", "rate=0:free", "--client-quota", "rate=0.001,burst=1:refused",
             "--client-identity-header", "x-client-id", "--trusted-proxies", "127.0.0.1"]
    good, greedy = GOOD_SHARE * cap, OVERLOAD * cap
    with Server(os.path.join(bin_dir, "sluice-server"), repository, os.path.join(workdir, "quota.log"),
                prefix=prefixes[0], extra_args=flags) as server:
        pid = server.process.pid
        for rep in range(1 if smoke else reps):
            seed = 100 * rep
            good_stream = ("good", path, good, as_client("good"))
            raw["unloaded"].append(together(load, server.url, [good_stream], seed))
            raw["quota"].append(together(load, server.url, [good_stream, ("greedy", path, greedy, as_client("greedy"))],
                                         seed))
            raw["no_quota"].append(together(load, server.url, [good_stream, ("greedy", path, greedy, as_client("free"))],
                                            seed))
            raw["refusals"].append({"refused": cpu_window(load, server.url, path, greedy, "refused", seed, pid)})
            raw["served"].append({"free": cpu_window(load, server.url, path, SERVED_SHARE * cap, "free", seed, pid)})
    report = {"model": MODEL, "capacity_per_s": cap, "good_rate_per_s": good, "greedy_rate_per_s": greedy,
              "quota": flags[1], "windows": {}, "raw": raw}
    for window, runs in raw.items():
        report["windows"][window] = {stream: summarize([run[stream] for run in runs]) for stream in runs[0]}
    w = report["windows"]
    unloaded = w["unloaded"]["good"]["answered_p99_us"]
    refused_cpu = w["refusals"]["refused"]["server_cpu_us_per_request"]
    served_cpu = w["served"]["free"]["server_cpu_us_per_request"]
    report["good_p99_over_unloaded"] = {window: w[window]["good"]["answered_p99_us"] / unloaded if unloaded else None
                                        for window in ("quota", "no_quota")}
    report["refused_cpu_over_served"] = refused_cpu / served_cpu if served_cpu else None
    good_quota = w["quota"]["good"]
    report["met"] = {
        "good_loses_no_request": good_quota["ok"] == good_quota["sent"],
        "good_p99_within_1_5x_unloaded": bool(unloaded) and good_quota["answered_p99_us"] <= P99_TARGET * unloaded,
        "refused_cpu_within_10pct_of_served": bool(served_cpu) and refused_cpu <= CPU_TARGET * served_cpu,
    }
    return report


def print_table(report):
    print(f"\npinning: {report['pinning']}; awake: {report['awake']}; medians of {report['reps']} repetitions")
    print(f"{report['model']}: capacity {report['capacity_per_s']:.0f}/s; good {report['good_rate_per_s']:.0f}/s, "
          f"greedy {report['greedy_rate_per_s']:.0f}/s; quota per client {report['quota']}")
    print(f"{'window':>9} {'stream':>7} {'sent':>6} {'answered/s':>10} {'p50 us':>9} {'p99 us':>9} {'quota':>6} "
          f"{'full':>6} {'cpu us/req':>10}")
    for window, streams in report["windows"].items():
        for stream, f in streams.items():
            cpu = f.get("server_cpu_us_per_request")
            print(f"{window:>9} {stream:>7} {f['sent']:>6.0f} {f['answered_per_s']:>10.0f} {f['answered_p50_us']:>9.0f} "
                  f"{f['answered_p99_us']:>9.0f} {f['resource_exhausted']:>6.0f} {f['unavailable']:>6.0f} "
                  f"{'' if cpu is None else f'{cpu:.0f}':>10}")
    ratios = report["good_p99_over_unloaded"]
    print("good's p99 over its unloaded p99: " + ", ".join(
        f"{window} {ratio:.2f}x" for window, ratio in ratios.items() if ratio is not None))
    if report["refused_cpu_over_served"] is not None:
        print(f"server CPU per refused request over a served one: {report['refused_cpu_over_served']:.3f}")
    print("targets: " + ", ".join(f"{key}={'yes' if ok else 'NO'}" for key, ok in report["met"].items()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per window")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each window")
    parser.add_argument("--no-pin", action="store_true", help="do not pin the server and the clients to CPUs")
    parser.add_argument("--no-awake", action="store_true",
                        help="let the CPUs go idle between requests (see harness.bench.awake)")
    parser.add_argument("--smoke", action="store_true", help="check that the benchmark runs (numbers mean nothing)")
    parser.add_argument("--json", default=os.path.join(ROOT, "build", "quota_benchmark.json"))
    args = parser.parse_args()
    prefixes, pin_note = pinning(not args.no_pin)
    report = {"pinning": pin_note, "reps": 1 if args.smoke else args.reps, "smoke": args.smoke}
    with tempfile.TemporaryDirectory(prefix="sluice-quota-bench-") as workdir:
        with awake(not args.no_awake and not args.smoke) as awake_note:
            report["awake"] = awake_note
            report.update(measure(args.bin_dir, prefixes, workdir, args.smoke,
                                  seconds=args.seconds, warmup=args.warmup, reps=args.reps))
    print_table(report)
    write_json(args.json, report)


if __name__ == "__main__":
    try:
        main()
    except BenchmarkError as error:
        sys.exit(f"quota_benchmark: {error}")
