#!/usr/bin/env python3
"""Two sluice-server binaries side by side with the floor benchmark's tools (sluice-bench-load,
the same request bytes, the server on one CPU and the client on another), for small request-path
changes: p50 at concurrency 1, server CPU per request at a fixed 2,000/s, and requests/s at 32,
on the bundled MLP and the trivial addsub model. Sides alternate (ABBA), a fresh server per side
and repetition; medians and after/before ratios are printed and written as JSON.

    .venv/bin/python benchmarks/floor_ab.py --before OLD/sluice-server [--after build/bin/sluice-server] \\
        [--reps 6] [--json out.json]
    .venv/bin/python benchmarks/floor_ab.py --smoke --bin-dir build/bin --json out.json
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import floor_benchmark as fb  # noqa: E402
from batching_benchmark import ROOT, pinning  # noqa: E402
from request_path_benchmark import Server  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="required unless --smoke")
    parser.add_argument("--after", default=os.path.join(ROOT, "build", "bin", "sluice-server"))
    parser.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"), help="where sluice-bench-load is")
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--smoke", action="store_true",
                        help="the test command's check that the script runs: --after against itself, "
                             "one repetition of tiny windows; the numbers mean nothing")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.smoke:
        args.after = os.path.join(args.bin_dir, "sluice-server")
        args.before = args.before or args.after
        args.reps, args.seconds = 1, 0.2
    elif not args.before:
        parser.error("--before is required")
    (server_prefix, client_prefix), note = pinning(True)
    binaries = {"before": args.before, "after": args.after}
    raw = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory(prefix="sluice-floor-ab-") as workdir:
        repository, files = fb.make_mlp_addsub(workdir)
        load = fb.Load(args.bin_dir, client_prefix, workdir, (0.1 if args.smoke else 1.0, args.seconds))
        for rep in range(args.reps):
            for side in (["before", "after"] if rep % 2 == 0 else ["after", "before"]):
                with Server(binaries[side], repository, os.path.join(workdir, f"{side}.log"), prefix=server_prefix) as server:
                    pid, out = server.process.pid, raw[side]
                    for model in ("mlp", "addsub"):
                        out.setdefault(f"{model}_c1_p50_us", []).append(load.run(server.url, files[model], 1)["p50_us"])
                        out.setdefault(f"{model}_cpu_us", []).append(
                            load.run(server.url, files[model], 32, rate=fb.FIXED_RATE, server_pid=pid)["server_cpu_us_per_call"])
                        out.setdefault(f"{model}_c32_per_s", []).append(load.run(server.url, files[model], 32)["calls_per_s"])
    medians = {}
    print(f"pinning: {note}\n\n{'metric':20} {'before':>9} {'after':>9} {'after/before':>13}")
    for key in raw["before"]:
        before, after = statistics.median(raw["before"][key]), statistics.median(raw["after"][key])
        medians[key] = {"before": before, "after": after, "ratio": after / before}
        print(f"{key:20} {before:9.1f} {after:9.1f} {after / before:13.3f}")
    if args.json:
        fb.write_json(args.json, {"pinning": note, "reps": args.reps, "medians": medians, "raw": raw})
    return 0


if __name__ == "__main__":
    sys.exit(main())
