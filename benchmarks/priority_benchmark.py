#!/usr/bin/env python3
"""Two priority levels under 2x overload, against the same model without priorities, in one run.
Prints a table and writes JSON.

    .venv/bin/python benchmarks/priority_benchmark.py [--reps 3] [--seconds 3] [--json out.json]
    .venv/bin/python benchmarks/priority_benchmark.py --smoke --bin-dir build/bin --json out.json

Per model (the bundled MLP, and "wideconv": the conv net with 64-channel convolutions, whose
capacity compute decides rather than the transport), one server holds two copies with dynamic
batching, one instance: "<model>_flat" (no priorities) and "<model>_ranked" (priority_levels: 2,
default_priority_level: 2; every level with the default queue policy, so each level may hold
--max-queue-size requests). First the model's capacity: the highest closed-loop requests/s of
the flat copy over concurrencies 8, 32 and 64. Then, per repetition, Poisson open-loop windows
(sluice-bench-load, at most 4096 calls in flight):

  unloaded   the high stream alone on the ranked copy: 10 % of capacity, priority 1
  ranked     the high stream and, at the same time, the low stream (2x capacity, priority 2) on
             the ranked copy
  flat       the same two streams on the flat copy, which ignores the priority parameter

Priorities order the batcher's queue. Where the transport, not the model, is what saturates (the
MLP on one CPU: gRPC's per-request cost is most of a request's), requests wait in front of that
queue, in gRPC, where no priority reaches them; the MLP's rows show that limit.

Per stream: answered/s, p50 and p99 of the answered calls (us), refused calls (UNAVAILABLE: the
queue is full). Medians of --reps repetitions.

Target (issue 35): under 2x overload the high level's p99 stays within 2x its unloaded p99.

The server runs on one CPU and both clients on another (--no-pin: anywhere); the CPUs are kept
awake (harness.bench.awake; --no-awake). --smoke (the test command's check that the script runs):
the MLP, one repetition, tiny windows; its numbers mean nothing.
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import floor_benchmark as fb  # noqa: E402
from harness.bench import ROOT, awake, pinning, write_json  # noqa: E402
from harness.repository import write_bundled  # noqa: E402
from latency_target_benchmark import DERIVED, capacity, open_loop  # noqa: E402
from request_path_benchmark import BenchmarkError, Server  # noqa: E402

MODELS = ("mlp", "wideconv")
HIGH_SHARE = 0.1  # the high stream's rate, a share of capacity
OVERLOAD = 2.0    # the low stream's rate, in capacities
VARIANTS = {
    "flat": "dynamic_batching { }",
    "ranked": "dynamic_batching { priority_levels: 2 default_priority_level: 2 }",
}


def write_repository(workdir, model):
    """The two copies of `model` (a bundled model, or one DERIVED from one) in their own repository."""
    base, write_file = DERIVED.get(model, (model, None))
    source = os.path.join(workdir, f"bundled_{model}")
    write_bundled(source, [base], "dynamic_batching { }")
    with open(os.path.join(source, base, "config.pbtxt")) as f:
        config = f.read()
    if write_file:
        write_file(os.path.join(source, base, "1", "model.pt"))
    repository = os.path.join(workdir, f"repository_{model}")
    for variant, block in VARIANTS.items():
        name = f"{model}_{variant}"
        os.makedirs(os.path.join(repository, name, "1"), exist_ok=True)
        text = config.replace(f'name: "{base}"', f'name: "{name}"').replace("dynamic_batching { }", block)
        if block not in text:
            raise BenchmarkError(f"the bundled {base}'s config has no plain dynamic_batching block to replace")
        with open(os.path.join(repository, name, "config.pbtxt"), "w") as f:
            f.write(text)
        shutil.copyfile(os.path.join(source, base, "1", "model.pt"), os.path.join(repository, name, "1", "model.pt"))
    return repository


def request_file(workdir, model, variant, priority):
    """A one-row request for the copy `variant` carrying the parameter priority=`priority`."""
    from tritonclient.grpc import service_pb2
    request = service_pb2.ModelInferRequest.FromString(fb.request_bytes(DERIVED.get(model, (model,))[0]))
    request.model_name = f"{model}_{variant}"
    request.parameters["priority"].uint64_param = priority
    path = os.path.join(workdir, f"{model}_{variant}_{priority}.request")
    with open(path, "wb") as f:
        f.write(request.SerializeToString())
    return path


def together(load, url, streams, seed):
    """Open-loop windows of every (name, path, rate[, extra sluice-bench-load flags]) in `streams`
    at the same time: {name: JSON}."""
    results, errors = {}, []

    def run(offset, name, path, rate, extra=()):
        try:
            results[name] = open_loop(load, url, path, rate, target_us=0, seed=seed + offset, extra=extra)
        except BenchmarkError as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i, *stream)) for i, stream in enumerate(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def summarize(windows, keys=("ok", "answered_p50_us", "answered_p99_us", "refused", "not_sent", "client_cpu_busy")):
    out = {key: statistics.median(window[key] for window in windows) for key in keys}
    out["answered_per_s"] = statistics.median(window["ok"] / window["seconds"] for window in windows)
    return out


def measure(model, bin_dir, prefixes, workdir, smoke, *, seconds, warmup, reps):
    windows = (0.1, 0.3) if smoke else (warmup, seconds)
    load = fb.Load(bin_dir, prefixes[1], workdir, windows)
    repository = write_repository(workdir, model)
    files = {variant: {level: request_file(workdir, model, variant, level) for level in (1, 2)} for variant in VARIANTS}
    log = os.path.join(workdir, f"{model}_server.log")
    raw = {"unloaded": [], "ranked": [], "flat": []}
    with Server(os.path.join(bin_dir, "sluice-server"), repository, log, prefix=prefixes[0]) as server:
        cap = capacity(load, server.url, files["flat"][2])
        high_rate, low_rate = HIGH_SHARE * cap, OVERLOAD * cap
        for rep in range(1 if smoke else reps):
            seed = 100 * rep
            raw["unloaded"].append(together(load, server.url, [("high", files["ranked"][1], high_rate)], seed))
            for variant in ("ranked", "flat"):
                raw[variant].append(together(load, server.url, [("high", files[variant][1], high_rate),
                                                                ("low", files[variant][2], low_rate)], seed))
    report = {"capacity_per_s": cap, "high_rate_per_s": high_rate, "low_rate_per_s": low_rate, "windows": {}, "raw": raw}
    for window, runs in raw.items():
        report["windows"][window] = {stream: summarize([run[stream] for run in runs]) for stream in runs[0]}
    unloaded = report["windows"]["unloaded"]["high"]["answered_p99_us"]
    ranked = report["windows"]["ranked"]["high"]["answered_p99_us"]
    report["high_p99_over_unloaded"] = {variant: report["windows"][variant]["high"]["answered_p99_us"] / unloaded
                                        for variant in ("ranked", "flat")} if unloaded else {}
    report["met"] = {"high_p99_within_2x_unloaded": bool(unloaded) and ranked <= 2 * unloaded}
    return report


def print_table(report):
    print(f"\npinning: {report['pinning']}; awake: {report['awake']}; medians of {report['reps']} repetitions")
    for model, figures in report["models"].items():
        print(f"\n{model}: capacity {figures['capacity_per_s']:.0f}/s (closed loop, flat copy); high stream "
              f"{figures['high_rate_per_s']:.0f}/s (priority 1), low stream {figures['low_rate_per_s']:.0f}/s (priority 2)")
        print(f"{'window':>9} {'stream':>6} {'answered/s':>10} {'p50 us':>9} {'p99 us':>9} {'refused':>8} {'client':>7}")
        for window, streams in figures["windows"].items():
            for stream, f in streams.items():
                print(f"{window:>9} {stream:>6} {f['answered_per_s']:>10.0f} {f['answered_p50_us']:>9.0f} "
                      f"{f['answered_p99_us']:>9.0f} {f['refused']:>8.0f} {f['client_cpu_busy']:>7.2f}")
        ratios = figures.get("high_p99_over_unloaded", {})
        print("high stream's p99 over its unloaded p99: "
              + ", ".join(f"{variant} {ratio:.2f}x" for variant, ratio in ratios.items()))
        print("targets: " + ", ".join(f"{key}={'yes' if ok else 'NO'}" for key, ok in figures["met"].items()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per window")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each window")
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    parser.add_argument("--no-pin", action="store_true", help="do not pin the server and the clients to CPUs")
    parser.add_argument("--no-awake", action="store_true",
                        help="let the CPUs go idle between requests (see harness.bench.awake)")
    parser.add_argument("--smoke", action="store_true", help="check that the benchmark runs (numbers mean nothing)")
    parser.add_argument("--json", default=os.path.join(ROOT, "build", "priority_benchmark.json"))
    args = parser.parse_args()
    prefixes, pin_note = pinning(not args.no_pin)
    report = {"pinning": pin_note, "reps": 1 if args.smoke else args.reps, "smoke": args.smoke, "models": {}}
    with tempfile.TemporaryDirectory(prefix="sluice-priority-bench-") as workdir:
        with awake(not args.no_awake and not args.smoke) as awake_note:
            report["awake"] = awake_note
            for model in ["mlp"] if args.smoke else args.models:
                report["models"][model] = measure(model, args.bin_dir, prefixes, workdir, args.smoke,
                                                  seconds=args.seconds, warmup=args.warmup, reps=args.reps)
    print_table(report)
    write_json(args.json, report)


if __name__ == "__main__":
    try:
        main()
    except BenchmarkError as error:
        sys.exit(f"priority_benchmark: {error}")
