#!/usr/bin/env python3
"""How well the server feeds an accelerator: Sluice against a simulated device whose costs look
like the H200's ResNet-50 FP16, so that batching and the instance pool can be engineered on a
machine without a GPU.

    .venv/bin/python benchmarks/device_feed_benchmark.py [--smoke] [--json out.json]
        [--time-scale 4] [--concurrency 1,8,16,32,64,128] [--instances 1,2]
        [--stage-ahead off,on --repetitions 6]

The device is the operator library sluice_sim_device.so (benchmarks/sim_device): one compute
engine shared by the process, two copy engines, a stream per instance. A forward of `rows` holds
its instance's thread for the launch cost, then the compute engine for d0 + d1 * rows (it cannot
end before its launch did: small batches are launch-bound), and the copies take bytes / bandwidth
on their engines. The defaults are the 2026-12-04 H200's: launch 2.6 ms, d0 1.0 ms, d1 94 us a
row, 50 GB/s, every time multiplied by --time-scale (default 4): at the H200's own speed the
rates would exceed what this machine's two cores can carry over gRPC, and the ratios below do not
depend on the device's speed. The launch sleeps rather than spins (--launch-spin spins): on a
host with two cores a spinning launch would starve the server's other threads, which a 16-core
GPU host does not suffer.

The model is served as the GPU kit's ResNet-50 is: a 3x224x224 FP16 image a row (301 KB; the
host's share of the work, moving those bytes, is what left the H200 idle between batches),
max_batch_size 64, preferred batch sizes {1, 8, 32, 64} with padding, KIND_CPU instances (one and
two). perf_analyzer drives it at each
concurrency over gRPC and over system shared memory. Per level:
  rows/s       real rows answered per second (the server's inference count over the run)
  of best      that against the device's best, max_batch / (d0 + d1 * max_batch)
  held         the compute engine's busy time / wall time (the device's utilisation)
  padding      the compute time spent on padded rows / wall time
  rows/batch   real and computed (padded) rows per batch
  p99          perf_analyzer's p99, and against the forward at the batch the server formed
  cpu/req      the server's CPU time per request (over gRPC, where the transport's limit shows)

The H200 pattern (docs/gpu/2026-12-04-h200.md): 8 closed-loop clients formed batches of about 4
real rows, and at 64 clients the server reached 0.44 of the device's best. The JSON says whether
the simulation reproduces it (c=8: 2.5-5.5 real rows a batch; c=64 over gRPC with one instance:
0.4-0.6 of best).

--stage-ahead off,on serves the model both ways (sluice.stage_ahead: a full batch assembled while
the batch before it runs) and --repetitions N repeats every setting N times, the settings taking
turns, one server each; with either, a table of medians over the repetitions follows (an A/B in
one run). Off is the server's path without staging ahead.

Prints a table and writes JSON. --smoke runs a tiny version (the test command runs it so the
script keeps working); its numbers mean nothing.
"""
import argparse
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from harness import perf_analyzer as harness_perf_analyzer  # noqa: E402
from harness.process import cpu_seconds  # noqa: E402
from harness.bench import model_stats, pinning, start_server, write_json  # noqa: E402
from harness.server import FREE  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "scripts", "gpu_kit"))
import kitlib  # noqa: E402  (the batch cycle from /metrics, read as the GPU kit reads it)

H200 = {"launch_us": 2600.0, "d0_us": 1000.0, "d1_us": 94.0, "gbps": 50.0}
MAX_BATCH = 64
PREFERRED = (1, 8, 32, 64)
PATTERN = {"c8_real_rows_per_batch": (2.5, 5.5), "c64_grpc_of_best": (0.4, 0.6)}
STATS = ("now_ns", "compute_busy_ns", "compute_items", "compute_rows", "h2d_busy_ns", "d2h_busy_ns",
         "h2d_bytes", "d2h_bytes")


def device_params(scale):
    return {"launch_us": H200["launch_us"] * scale, "d0_us": H200["d0_us"] * scale,
            "d1_us": H200["d1_us"] * scale, "gbps": H200["gbps"] / scale}


def write_models(root, library, params, row_elements, width, instances, launch_spin, stage_ahead):
    """The simulated model (`sim`) and `sim_stats`, whose answer is the device's counters."""
    import torch
    torch.ops.load_library(library)

    class Sim(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.width = width
            self.launch_us, self.d0_us, self.d1_us = params["launch_us"], params["d0_us"], params["d1_us"]
            self.gbps = params["gbps"]
            self.launch_spin = launch_spin

        def forward(self, x):
            y = torch.ops.sluice_sim.h2d(x, self.gbps)
            y = torch.ops.sluice_sim.launch(y, self.width, self.launch_us, self.d0_us, self.d1_us, self.launch_spin)
            y = torch.ops.sluice_sim.d2h(y, self.gbps)
            return torch.ops.sluice_sim.sync(y, False)

    class Stats(torch.nn.Module):
        def forward(self, x):
            return torch.ops.sluice_sim.stats() + x * 0

    os.makedirs(os.path.join(root, "sim", "1"))
    torch.jit.script(Sim()).save(os.path.join(root, "sim", "1", "model.pt"))
    preferred = ", ".join(map(str, PREFERRED))
    with open(os.path.join(root, "sim", "config.pbtxt"), "w") as f:
        f.write(f"""max_batch_size: {MAX_BATCH}
input [ {{ name: "INPUT__0" data_type: TYPE_FP16 dims: [ {row_elements} ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP16 dims: [ {width} ] }} ]
dynamic_batching {{ preferred_batch_size: [ {preferred} ] }}
parameters {{ key: "sluice.pad_batch_to_preferred" value {{ string_value: "true" }} }}
parameters {{ key: "sluice.stage_ahead" value {{ string_value: "{str(stage_ahead).lower()}" }} }}
instance_group [ {{ kind: KIND_CPU count: {instances} }} ]
""")
    os.makedirs(os.path.join(root, "sim_stats", "1"))
    torch.jit.script(Stats()).save(os.path.join(root, "sim_stats", "1", "model.pt"))
    with open(os.path.join(root, "sim_stats", "config.pbtxt"), "w") as f:
        f.write("""max_batch_size: 0
input [ { name: "INPUT__0" data_type: TYPE_INT64 dims: [ 8 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_INT64 dims: [ 8 ] } ]
""")


def device_stats(url):
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(url=url)
    try:
        x = grpcclient.InferInput("INPUT__0", [8], "INT64")
        x.set_data_from_numpy(np.zeros(8, dtype=np.int64))
        values = client.infer("sim_stats", [x]).as_numpy("OUTPUT__0")
    finally:
        client.close()
    return dict(zip(STATS, (int(v) for v in values)))


def level(server, concurrency, transport, workdir, params, smoke, prefix):
    url, pid = server.url, server.process.pid
    cycle_before = kitlib.batch_cycle(server.metrics_text(), "sim")
    stats_before, device_before = model_stats(url, "sim"), device_stats(url)
    cpu_before = cpu_seconds(pid)
    extra = ["--shared-memory", "system"] if transport == "shm" else []
    run = harness_perf_analyzer.run(url, "sim", concurrency,
                                    os.path.join(workdir, f"sim_{concurrency}_{transport}.csv"),
                                    smoke=smoke, interval_ms=1500, prefix=prefix, extra=extra)
    cpu = cpu_seconds(pid) - cpu_before
    stats_after, device_after = model_stats(url, "sim"), device_stats(url)
    cycle_after = kitlib.batch_cycle(server.metrics_text(), "sim")
    device = {k: device_after[k] - device_before[k] for k in STATS}
    wall_s = device["now_ns"] / 1e9
    real_rows = stats_after.inference_count - stats_before.inference_count
    executions = stats_after.execution_count - stats_before.execution_count
    computed_rows = device["compute_rows"]
    best = MAX_BATCH / ((params["d0_us"] + params["d1_us"] * MAX_BATCH) / 1e6)
    rows_per_s = real_rows / wall_s if wall_s > 0 else 0
    formed = computed_rows / max(device["compute_items"], 1)
    forward_us = max(params["launch_us"], params["d0_us"] + params["d1_us"] * formed)
    p99_us = float(run["p99 latency"])
    return {
        "concurrency": concurrency, "transport": transport, "wall_s": round(wall_s, 3),
        "real_rows": real_rows, "executions": executions, "rows_per_s": round(rows_per_s, 1),
        "best_rows_per_s": round(best, 1), "of_best": round(rows_per_s / best, 3),
        "held": round(device["compute_busy_ns"] / max(device["now_ns"], 1), 3),
        "padding": round(params["d1_us"] * 1e3 * (computed_rows - real_rows) / max(device["now_ns"], 1), 3),
        "real_rows_per_batch": round(real_rows / max(executions, 1), 2),
        "computed_rows_per_batch": round(formed, 2),
        "perf_analyzer_infer_per_s": float(run["Inferences/Second"]),
        "p50_us": float(run["p50 latency"]), "p99_us": p99_us,
        "forward_at_formed_us": round(forward_us, 1), "p99_over_forward": round(p99_us / forward_us, 2),
        "server_cpu_us_per_request": round(cpu * 1e6 / max(real_rows, 1), 1),
        "h2d_held": round(device["h2d_busy_ns"] / max(device["now_ns"], 1), 4),
        # Per batch, from sluice_batch_phase_seconds_total: the host phases (us) and the share
        # staged ahead, as the GPU kit's 50_throughput reports them.
        "cycle": {key: round(value, 3) for key, value in
                  kitlib.cycle_report(cycle_after, cycle_before, executions).items()},
    }


def pattern(levels):
    """Whether the run shows the H200's pattern (one instance, over gRPC, without staging ahead; the
    current build's)."""
    found = {}
    for row in levels:
        if (row["instances"] == 1 and row["transport"] == "grpc" and not row["stage_ahead"]
                and row["build"] == "current"):
            if row["concurrency"] == 8:
                found["c8_real_rows_per_batch"] = row["real_rows_per_batch"]
            if row["concurrency"] == 64:
                found["c64_grpc_of_best"] = row["of_best"]
    checks = {name: {"value": found.get(name), "range": bounds,
                     "holds": found.get(name) is not None and bounds[0] <= found[name] <= bounds[1]}
              for name, bounds in PATTERN.items()}
    return {"checks": checks, "reproduced": all(check["holds"] for check in checks.values())}


# What tells one median's runs from another's: the build and setting, at one level.
LEVEL = ("instances", "transport", "concurrency")
SETTING = ("build",) + LEVEL + ("stage_ahead",)


def setting_of(row):
    return tuple(row[k] for k in SETTING)


def compare(levels, entries, entry, other, ratio_name, count_name):
    """Sets entry[ratio_name] to its median rows/s over the median of the entry for the same
    instances, transport and concurrency that `other(e)` picks, and entry[count_name] to how many of
    entry's repetitions beat every repetition of that other one."""
    same = [e for e in entries if other(e) and all(e[k] == entry[k] for k in LEVEL)]
    if not same or same[0]["rows_per_s"] <= 0:
        return
    mine = [r for r in levels if setting_of(r) == setting_of(entry)]
    theirs = [r for r in levels if setting_of(r) == setting_of(same[0])]
    entry[ratio_name] = round(entry["rows_per_s"] / same[0]["rows_per_s"], 3)
    best_other = max(r["rows_per_s"] for r in theirs)
    entry[count_name] = sum(1 for r in mine if r["rows_per_s"] > best_other)


def medians(levels):
    """Per build, instances, transport, concurrency and setting: the median of each figure over the
    repetitions; with both settings run, on's median rows/s over off's ("vs_off") and in how many
    repetitions on beat the best off ("on_above_every_off"); with a baseline build, the current
    build's over the baseline's at the same setting ("vs_baseline", "above_every_baseline")."""
    out = []
    for key in sorted({setting_of(r) for r in levels}):
        rows = [r for r in levels if setting_of(r) == key]
        entry = dict(zip(SETTING, key), repetitions=len(rows))
        for figure in ("rows_per_s", "of_best", "held", "padding", "real_rows_per_batch", "p99_us",
                       "p99_over_forward", "server_cpu_us_per_request"):
            entry[figure] = round(float(np.median([r[figure] for r in rows])), 3)
        out.append(entry)
    for entry in out:
        if entry["stage_ahead"]:
            compare(levels, out, entry, lambda e, entry=entry: e["build"] == entry["build"] and not e["stage_ahead"],
                    "vs_off", "on_above_every_off")
        if entry["build"] == "current":
            compare(levels, out, entry,
                    lambda e, entry=entry: e["build"] == "baseline" and e["stage_ahead"] == entry["stage_ahead"],
                    "vs_baseline", "above_every_baseline")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    parser.add_argument("--json", default=os.path.join(ROOT, "build", "device_feed_benchmark.json"))
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--time-scale", type=float, default=4.0)
    parser.add_argument("--concurrency", default="1,8,16,32,64,128")
    parser.add_argument("--instances", default="1,2")
    parser.add_argument("--transports", default="grpc,shm")
    parser.add_argument("--row-elements", type=int, default=3 * 224 * 224,
                        help="FP16 elements per input row (default: a ResNet-50 image, 301 KB)")
    parser.add_argument("--width", type=int, default=1000, help="FP16 elements per output row")
    parser.add_argument("--launch-spin", action="store_true")
    parser.add_argument("--stage-ahead", default="off",
                        help="off, on, or off,on: serve the model with sluice.stage_ahead so (default off)")
    parser.add_argument("--repetitions", type=int, default=1,
                        help="run every setting this many times, the settings taking turns (default 1)")
    parser.add_argument("--baseline-bin-dir", default=None,
                        help="also run every setting on the server in this bin directory (the commit before, "
                             "built apart), the two builds taking turns; the medians compare them")
    parser.add_argument("--no-pin", action="store_true")
    args = parser.parse_args()
    library = os.path.join(os.path.dirname(os.path.abspath(args.bin_dir)), "lib", "libsluice_sim_device.so")
    if not os.path.exists(library):
        sys.exit(f"{library} is missing: build the sluice_sim_device target")
    params = device_params(args.time_scale)
    concurrencies = [1, 8] if args.smoke else [int(c) for c in args.concurrency.split(",")]
    row_elements = 512 if args.smoke else args.row_elements
    instance_counts = [1] if args.smoke else [int(n) for n in args.instances.split(",")]
    transports = args.transports.split(",")
    stages = []
    for word in args.stage_ahead.split(","):
        if word not in ("off", "on"):
            sys.exit(f"--stage-ahead takes off, on or off,on; found {word!r}")
        stages.append(word == "on")
    repetitions = 1 if args.smoke else max(1, args.repetitions)
    (server_prefix, client_prefix), pin_note = pinning(not args.no_pin)
    levels = []
    with tempfile.TemporaryDirectory() as workdir:
        builds = [("current", args.bin_dir)]
        if args.baseline_bin_dir:
            builds.append(("baseline", args.baseline_bin_dir))
        runs = [(repetition, build, stage, instances) for repetition in range(repetitions) for build in builds
                for stage in stages for instances in instance_counts]
        for repetition, (build, bin_dir), stage, instances in runs:
            root = os.path.join(workdir, f"models_{repetition}_{build}_{int(stage)}_{instances}")
            write_models(root, library, params, row_elements, args.width, instances, args.launch_spin, stage)
            # Both builds drive the same simulated device (this build's library).
            server = start_server(bin_dir, root, ["--operator-library", library, "--allow-client-shm=true",
                                                       "--client-shm-keys=*"], prefix=server_prefix, timeout=120,
                                  metrics_port=FREE)
            process = server.process
            try:
                for transport in transports:
                    for concurrency in concurrencies:
                        row = level(server, concurrency, transport, workdir, params, args.smoke, client_prefix)
                        row["instances"] = instances
                        row["stage_ahead"] = stage
                        row["repetition"] = repetition
                        row["build"] = build
                        levels.append(row)
                        print(f"{build:8} instances {instances} stage ahead {'on ' if stage else 'off'} {transport:4} "
                              f"c={concurrency:<4} {row['rows_per_s']:9.1f} rows/s "
                              f"of best {row['of_best']:.3f} held {row['held']:.3f} padding {row['padding']:.3f} "
                              f"rows/batch {row['real_rows_per_batch']:.1f}/{row['computed_rows_per_batch']:.1f} "
                              f"p99 {row['p99_us']:.0f} us ({row['p99_over_forward']:.1f}x forward) "
                              f"cpu/req {row['server_cpu_us_per_request']:.0f} us", flush=True)
                        cycle = row["cycle"]
                        print("    cycle us: " + " ".join(f"{phase} {cycle[phase + '_us']:.0f}"
                                                          for phase in kitlib.HOST_PHASES + kitlib.OFF_CYCLE_PHASES)
                              + f"; staged ahead {cycle['staged_ahead_share']:.2f} of batches", flush=True)
            finally:
                process.terminate()
                process.wait(timeout=60)
    best = levels[0]["best_rows_per_s"] if levels else 0
    print(f"\nSluice feeding a simulated device (H200 ResNet-50 FP16 costs x{args.time_scale:g}: "
          f"launch {params['launch_us']:.0f} us, d0 {params['d0_us']:.0f} us, d1 {params['d1_us']:.0f} us/row, "
          f"{params['gbps']:.1f} GB/s; best {best:.0f} rows/s at batch {MAX_BATCH}); {pin_note}")
    header = ["inst", "ahead", "transport", "c", "rows/s", "of best", "held", "padding", "real/batch", "computed/batch",
              "p99 us", "p99/forward", "cpu us/req"]
    print(" ".join(f"{h:>14}" for h in header))
    for row in levels:
        print(" ".join(f"{v:>14}" for v in (row["instances"], "on" if row["stage_ahead"] else "off",
                                            row["transport"], row["concurrency"], row["rows_per_s"],
                                            row["of_best"], row["held"], row["padding"], row["real_rows_per_batch"],
                                            row["computed_rows_per_batch"], round(row["p99_us"]),
                                            row["p99_over_forward"], row["server_cpu_us_per_request"])))
    report = {"benchmark": "device_feed", "smoke": args.smoke, "time_scale": args.time_scale,
              "device": {"h200": H200, "simulated": params, "launch_spin": args.launch_spin,
                         "max_batch_size": MAX_BATCH, "preferred_batch_sizes": list(PREFERRED),
                         "row_bytes": row_elements * 2, "answer_row_bytes": args.width * 2},
              "pinning": pin_note, "repetitions": repetitions, "levels": levels}
    if len(stages) > 1 or repetitions > 1 or len(builds) > 1:
        report["medians"] = medians(levels)
        print(f"\nMedians over {repetitions} repetition(s), settings taking turns:")
        header = ["build", "inst", "transport", "c", "ahead", "rows/s", "of best", "held", "p99/forward",
                  "cpu us/req", "vs off", "vs baseline"]
        print(" ".join(f"{h:>12}" for h in header))
        for row in report["medians"]:
            print(" ".join(f"{v:>12}" for v in (row["build"], row["instances"], row["transport"], row["concurrency"],
                                                "on" if row["stage_ahead"] else "off", row["rows_per_s"],
                                                row["of_best"], row["held"], row["p99_over_forward"],
                                                row["server_cpu_us_per_request"], row.get("vs_off", ""),
                                                row.get("vs_baseline", ""))))
    if not args.smoke:
        report["h200_pattern"] = pattern(levels)
        checks = report["h200_pattern"]["checks"]
        said = ", ".join(f"{name} {check['value']} in {check['range']}" for name, check in checks.items())
        print(f"\nH200 pattern reproduced: {report['h200_pattern']['reproduced']} ({said})")
    write_json(args.json, report)


if __name__ == "__main__":
    main()
