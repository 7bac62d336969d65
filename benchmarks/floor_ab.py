#!/usr/bin/env python3
"""Two sluice-server builds (or one build with two sets of flags) side by side with the floor
benchmark's tools (sluice-bench-load, the same request bytes, the server on one CPU and the client
on another), for request-path changes. Sides alternate (ABBA), a fresh server per side and
repetition; the bare echo (callback API) and in-process LibTorch are measured in the same run, so
the cost figures of issue 20 can be compared side by side. Medians and after/before ratios are
printed and written as JSON.

    .venv/bin/python benchmarks/floor_ab.py --before OLD/sluice-server [--after build/bin/sluice-server] \\
        [--before-args "--flag value"] [--after-args "..."] [--after-model-params KEY=VALUE ...] \\
        [--reps 6] [--json out.json]
    .venv/bin/python benchmarks/floor_ab.py --smoke --bin-dir build/bin --json out.json

Per side and repetition (the floor benchmark's models):
  mlp_c1_p50_us, addsub_c1_p50_us      p50 at concurrency 1
  mlp_cpu_us, addsub_cpu_us            server CPU per request at a fixed 2,000/s
  mlp_c32_per_s, addsub_c32_per_s      requests/s closed loop at concurrency 32
  mlp_c32_batch                        the batch the server formed at 32 (ModelStatistics)
  mlp_c32_cpu_us                       server CPU per request at 32
  mlp_c32_voluntary, _involuntary      the server's context switches per request at 32 (every
                                       thread, /proc/<pid>/task/*/status), and by thread group
  mlp_c32_cost_ratio                   (1e6 / mlp_c32_per_s) / (echo CPU per call at 32 +
                                       in-process us per row at the formed batch), this repetition's echo
  mlp_c32_cost_ratio_weighted          the same against in-process LibTorch running the forwards the
                                       server ran (batch_stats' sizes, in-process time between the
                                       measured sizes interpolated): the mean batch flatters a spread
  mlp_c32_one_row_share                the share of the forwards at 32 that ran one row
  mlp_c1_overhead_us                   mlp_c1_p50_us - echo c=1 p50 - in-process batch-1 p50
  convnet_c8_per_s, convnet_c32_per_s  requests/s at 8 and 32 (--no-convnet leaves them out)
--smoke (the test command's check that the script runs): --after against itself (its models with
sluice.run_on_receiving_thread on), one repetition of tiny windows; the numbers mean nothing.
"""
import argparse
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import floor_benchmark as fb  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from harness.bench import (ROOT, batch_executions, executions_between, make_repository as make_bundled,  # noqa: E402
                           model_stats, pinning)
from request_path_benchmark import BenchmarkError, Server, make_repository as make_trivial  # noqa: E402

LOWER_IS_BETTER = ("p50_us", "cpu_us", "voluntary", "involuntary", "cost_ratio", "cost_ratio_weighted",
                   "overhead_us", "one_row_share")


def measure_echo(args, prefixes, load, request_file, echo):
    with fb.EchoServer(args.bin_dir, "callback", prefixes[0]) as server:
        echo.setdefault("c1_p50_us", []).append(load.run(server.url, request_file, 1)["p50_us"])
        run = load.run(server.url, request_file, 32, server_pid=server.process.pid)
        echo.setdefault("c32_cpu_us", []).append(run["server_cpu_us_per_call"])
        echo.setdefault("c32_voluntary", []).append(run["server_voluntary_switches_per_call"])
        echo.setdefault("c32_involuntary", []).append(run["server_involuntary_switches_per_call"])


def measure_side(binary, extra_args, repository, log, prefix, load, files, convnet, out):
    with Server(binary, repository, log, prefix=prefix, extra_args=extra_args) as server:
        pid = server.process.pid  # taskset execs: the pid is the server's

        def record(key, value):
            out.setdefault(key, []).append(value)

        for model in ("mlp", "addsub"):
            record(f"{model}_c1_p50_us", load.run(server.url, files[model], 1)["p50_us"])
            record(f"{model}_cpu_us",
                   load.run(server.url, files[model], 32, rate=fb.FIXED_RATE, server_pid=pid)["server_cpu_us_per_call"])
        before = model_stats(server.url, "mlp")
        run = load.run(server.url, files["mlp"], 32, server_pid=pid)
        after = model_stats(server.url, "mlp")
        executions = after.execution_count - before.execution_count
        formed = executions_between(batch_executions(before), batch_executions(after))
        out.setdefault("mlp_c32_batches", []).append(formed)
        record("mlp_c32_one_row_share", formed.get(1, 0) / max(1, sum(formed.values())))
        record("mlp_c32_per_s", run["calls_per_s"])
        record("mlp_c32_batch",
               (after.inference_count - before.inference_count) / executions if executions else 0.0)
        record("mlp_c32_cpu_us", run["server_cpu_us_per_call"])
        record("mlp_c32_voluntary", run["server_voluntary_switches_per_call"])
        record("mlp_c32_involuntary", run["server_involuntary_switches_per_call"])
        out.setdefault("mlp_c32_threads", []).append(run["server_threads_per_call"])
        record("addsub_c32_per_s", load.run(server.url, files["addsub"], 32)["calls_per_s"])
        if convnet:
            for concurrency in (8, 32):
                record(f"convnet_c{concurrency}_per_s", load.run(server.url, files["convnet"], concurrency)["calls_per_s"])


def with_parameters(repository, copy, parameters):
    """`repository`, or a copy of it at `copy` whose every config.pbtxt has `parameters`
    (KEY=VALUE strings) added."""
    if not parameters:
        return repository
    shutil.copytree(repository, copy)
    lines = []
    for parameter in parameters:
        key, _, value = parameter.partition("=")
        lines.append(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}')
    for model in os.listdir(copy):
        config = os.path.join(copy, model, "config.pbtxt")
        with open(config, "a") as f:
            f.write("\n" + "\n".join(lines) + "\n")
    return copy


def execution_us(inproc_model, size):
    """In-process LibTorch's time for one forward of `size` rows: its measured sizes' mean time per
    forward (1e6 * size / rows_per_s), linear between the two measured sizes around `size`, the
    nearest one's outside them."""
    sizes = sorted(inproc_model)
    at = {b: 1e6 * b / inproc_model[b]["rows_per_s"] for b in sizes}
    if size in at:
        return at[size]
    if size < sizes[0] or size > sizes[-1]:  # per row as the nearest measured size
        nearest = sizes[0] if size < sizes[0] else sizes[-1]
        return at[nearest] * size / nearest
    lower = max(b for b in sizes if b < size)
    upper = min(b for b in sizes if b > size)
    return at[lower] + (at[upper] - at[lower]) * (size - lower) / (upper - lower)


def weighted_per_row_us(inproc_model, formed):
    """What in-process LibTorch spends per row running the same forwards the server ran
    ({batch size: executions}): sum of executions x execution_us over the rows. The mean formed
    batch (the issue's reference) flatters a spread of sizes: 31- and 1-row forwards average 16
    rows, at which one row costs more than the 31s and 1s cost together per row."""
    rows = sum(size * count for size, count in formed.items())
    if rows == 0:
        return float("nan")
    return sum(execution_us(inproc_model, size) * count for size, count in formed.items()) / rows


def derive(side, echo, inproc):
    """Per repetition: the cost ratio at 32 (against the in-process time per row at the mean formed
    batch, the issue's definition, and against the same forwards in-process: _weighted) and the
    c=1 overhead, against that repetition's echo."""
    mlp = inproc["mlp"]
    for rep, per_s in enumerate(side["mlp_c32_per_s"]):
        nearest = min(mlp, key=lambda b: abs(b - side["mlp_c32_batch"][rep]))
        per_row_us = 1e6 / mlp[nearest]["rows_per_s"]
        # A window in which no call finished (a smoke run on a loaded machine) has no cost: NaN.
        per_call_us = 1e6 / per_s if per_s > 0 else float("nan")
        side.setdefault("mlp_c32_cost_ratio", []).append(per_call_us / (echo["c32_cpu_us"][rep] + per_row_us))
        weighted = weighted_per_row_us(mlp, side["mlp_c32_batches"][rep])
        side.setdefault("mlp_c32_cost_ratio_weighted", []).append(per_call_us / (echo["c32_cpu_us"][rep] + weighted))
        side.setdefault("mlp_c1_overhead_us", []).append(
            side["mlp_c1_p50_us"][rep] - echo["c1_p50_us"][rep] - mlp[1]["p50_us"])


def thread_medians(runs):
    """{group: {counter: median}} over the repetitions' by-thread-group counters."""
    groups = sorted({group for run in runs for group in run})
    return {group: {key: statistics.median(run.get(group, {}).get(key, 0.0) for run in runs)
                    for key in ("voluntary", "involuntary", "cpu_us")} for group in groups}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="required unless --smoke")
    parser.add_argument("--after", default=os.path.join(ROOT, "build", "bin", "sluice-server"))
    parser.add_argument("--before-args", default="", help="extra sluice-server flags for the before side")
    parser.add_argument("--after-args", default="", help="extra sluice-server flags for the after side")
    parser.add_argument("--before-model-params", nargs="*", default=[], metavar="KEY=VALUE",
                        help="config parameters added to every model of the before side's repository")
    parser.add_argument("--after-model-params", nargs="*", default=[], metavar="KEY=VALUE",
                        help="config parameters added to every model of the after side's repository "
                             "(e.g. sluice.run_on_receiving_thread=true)")
    parser.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"),
                        help="where sluice-bench-load, -echo and -inprocess are")
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--no-pin", action="store_true",
                        help="server and client share every CPU (what a server with CPUs to spare sees)")
    parser.add_argument("--no-convnet", action="store_true", help="leave out the conv net windows")
    parser.add_argument("--smoke", action="store_true",
                        help="the test command's check that the script runs: --after against itself, "
                             "one repetition of tiny windows; the numbers mean nothing")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.smoke:
        args.after = os.path.join(args.bin_dir, "sluice-server")
        args.before = args.before or args.after
        args.reps, args.seconds = 1, 0.2
        # The opt-in path runs end to end (a model on the receiving thread), whatever it measures.
        args.after_model_params = args.after_model_params or ["sluice.run_on_receiving_thread=true"]
    elif not args.before:
        parser.error("--before is required")
    convnet = not args.no_convnet
    (server_prefix, client_prefix), note = pinning(not args.no_pin)
    sides = {"before": (args.before, shlex.split(args.before_args)), "after": (args.after, shlex.split(args.after_args))}
    raw, echo = {"before": {}, "after": {}}, {}
    with tempfile.TemporaryDirectory(prefix="sluice-floor-ab-") as workdir:
        repository = os.path.join(workdir, "repository")
        make_bundled(repository, True, ["mlp", "convnet"] if convnet else ["mlp"])
        make_trivial(repository, models=("addsub",))
        repositories = {side: with_parameters(repository, os.path.join(workdir, f"repository_{side}"), params)
                        for side, params in (("before", args.before_model_params), ("after", args.after_model_params))}
        files = fb.write_request_files(workdir, ("mlp", "addsub", "convnet") if convnet else ("mlp", "addsub"))
        load = fb.Load(args.bin_dir, client_prefix, workdir, (0.1 if args.smoke else 1.0, args.seconds))
        try:
            inproc = fb.inprocess(args.bin_dir, repository, server_prefix, args.smoke, models=("mlp",))
            for rep in range(args.reps):
                measure_echo(args, (server_prefix, client_prefix), load, files["mlp"], echo)
                for side in (["before", "after"] if rep % 2 == 0 else ["after", "before"]):
                    binary, extra = sides[side]
                    measure_side(binary, extra, repositories[side], os.path.join(workdir, f"{side}.log"), server_prefix,
                                 load, files, convnet, raw[side])
        except BenchmarkError as error:
            print(f"floor A/B failed: {error}", file=sys.stderr)
            return 1
    for side in raw.values():
        derive(side, echo, inproc)
    medians = {}
    print(f"pinning: {note}\nbefore: {args.before} {args.before_args} {' '.join(args.before_model_params)}\n"
          f"after:  {args.after} {args.after_args} {' '.join(args.after_model_params)}\n")
    print(f"{'metric':28} {'before':>10} {'after':>10} {'after/before':>13}")
    for key in raw["before"]:
        if key in ("mlp_c32_threads", "mlp_c32_batches"):
            continue
        before, after = statistics.median(raw["before"][key]), statistics.median(raw["after"][key])
        ratio = after / before if before else float("nan")
        medians[key] = {"before": before, "after": after, "ratio": ratio,
                        "lower_is_better": key.endswith(LOWER_IS_BETTER)}
        print(f"{key:28} {before:10.2f} {after:10.2f} {ratio:13.3f}")
    echo_medians = {key: statistics.median(values) for key, values in echo.items()}
    print(f"\necho (callback API), same run: c=1 p50 {echo_medians['c1_p50_us']:.1f} us; at 32: "
          f"{echo_medians['c32_cpu_us']:.1f} us CPU, {echo_medians['c32_voluntary']:.2f} voluntary and "
          f"{echo_medians['c32_involuntary']:.2f} involuntary switches per call")
    print(f"in-process MLP: batch-1 p50 {inproc['mlp'][1]['p50_us']:.1f} us")
    threads = {side: thread_medians(raw[side]["mlp_c32_threads"]) for side in raw}
    print("\nMLP at 32, per request, by thread group (medians): voluntary / involuntary switches, CPU us")
    for side, groups in threads.items():
        for group, values in groups.items():
            print(f"  {side:7} {group:20} {values['voluntary']:6.2f} {values['involuntary']:6.2f} {values['cpu_us']:7.1f}")
    if args.json:
        fb.write_json(args.json, {
            "pinning": note, "reps": args.reps, "window_seconds": args.seconds,
            "before": {"binary": args.before, "args": args.before_args, "model_params": args.before_model_params},
            "after": {"binary": args.after, "args": args.after_args, "model_params": args.after_model_params},
            "medians": medians, "echo": echo_medians, "threads_mlp_c32": threads,
            "inprocess_mlp": {str(b): row for b, row in inproc["mlp"].items()}, "raw": raw, "echo_raw": echo})
    return 0


if __name__ == "__main__":
    sys.exit(main())
