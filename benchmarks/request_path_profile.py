#!/usr/bin/env python3
"""Where a request's server CPU goes: sluice-server (default flags, pinned to one CPU) under
`perf record` while sluice-bench-load (on another CPU) drives it, window by window. Samples are
grouped by thread and by library and turned into microseconds of server CPU per request (the
window's utime + stime from /proc, divided by its requests, times each group's share).

    .venv/bin/python benchmarks/request_path_profile.py [--seconds 4] [--json out.json]
    .venv/bin/python benchmarks/request_path_profile.py --smoke --bin-dir build/bin --json out.json

Windows (the floor benchmark's models and request bytes):
  addsub_fixed  the trivial model (two INT32 [16] inputs) at 2,000 requests/s
  mlp_fixed     the bundled MLP at 2,000 requests/s (one request per forward pass)
  mlp_c32       the bundled MLP, closed loop at concurrency 32 (the server batches)
Threads: sluice-batcher, sluice-worker-N (the forward pass and output delivery), everything
else in the process is gRPC's (its polling and callback threads: parsing, validation and
submission run there, as do the Finish of calls) or the metrics endpoint's. Libraries: the
kernel (TCP, epoll, futex wake-ups, scheduling), gRPC and its dependencies, protobuf, LibTorch
(with its OpenMP and oneDNN), the C/C++ runtime (malloc, memcpy, locks), Sluice's own code.
perf samples the CPU clock at --frequency Hz, kernel included (needs perf_event_open: root, a
user with sudo, or kernel.perf_event_paranoid <= 0 with the server pinned, <= 1 without).
--smoke (the test command): one tiny window (mlp_c32); its numbers mean nothing; where perf may
not sample (neither as it is nor through `sudo -n`), it exits 77, which ctest counts as skipped.
"""
import argparse
import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from harness.bench import ROOT, pinning, write_json  # noqa: E402
from floor_benchmark import FIXED_RATE, Load, cpu_seconds, make_mlp_addsub  # noqa: E402
from request_path_benchmark import BenchmarkError, Server  # noqa: E402

WINDOWS = (  # name, model, concurrency, rate (0: closed loop)
    ("addsub_fixed", "addsub", 32, FIXED_RATE),
    ("mlp_fixed", "mlp", 32, FIXED_RATE),
    ("mlp_c32", "mlp", 32, 0),
)
LIBRARY_GROUPS = (  # (group, file-name prefixes), first match wins
    ("kernel", ("[kernel", "[vdso]")),
    ("gRPC", ("libgrpc", "libgpr", "libaddress_sorting", "libupb", "libabsl", "libre2", "libcares",
              "libssl", "libcrypto", "libz.")),
    ("protobuf", ("libprotobuf",)),
    ("LibTorch", ("libtorch", "libc10", "libgomp", "libmkl", "libdnnl", "libiomp", "libshm")),
    ("C/C++ runtime", ("libc.so", "libc-", "libstdc++", "libm.so", "ld-linux", "libpthread", "libgcc")),
    ("Sluice", ("sluice-server",)),
    ("metrics, logging", ("libprometheus", "libspdlog", "libfmt", "libcivetweb")),
)


def library_group(dso):
    name = os.path.basename(dso)
    for group, prefixes in LIBRARY_GROUPS:
        if name.startswith(prefixes):
            return group
    return "other"


def thread_group(comm):
    if comm == "sluice-batcher":
        return "batcher"
    if comm.startswith("sluice-worker"):
        return "worker"
    return "gRPC and the rest"


# How perf is run: ["perf"], or through sudo where only root may open the events (perf_command).
PERF = ["perf"]
# Exit status of a smoke run that cannot profile here (ctest's SKIP_RETURN_CODE for the smokes).
SKIPPED = 77


def perf_command(cpu):
    """(command prefix, None) for running perf so that it may sample the server: as it is, or as
    `sudo -n perf` for a user with sudo on a kernel that forbids it to users (Debian's default
    kernel.perf_event_paranoid is 3); (None, why not) when neither may (a container without
    CAP_PERFMON, say). Probes what the windows do: CPU `cpu`'s events when the server is
    pinned (paranoid <= 0 for a user), else a process's own (<= 1), kernel included: asked for
    plain `cpu-clock`, perf quietly falls back to user space only where the kernel is off limits,
    so the probe asks for the kernel's part alone (`cpu-clock:k`), which does not fall back."""
    target = ["-C", str(cpu)] if cpu is not None else []
    why = ""
    for prefix in (["perf"], ["sudo", "-n", "perf"]):
        if prefix[0] == "sudo" and (os.geteuid() == 0 or shutil.which("sudo") is None):
            break
        try:
            probe = subprocess.run([*prefix, "stat", "-e", "cpu-clock:k", "-x,", *target, "--", "true"],
                                   capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            why = why or f"{' '.join(prefix)} stat did not finish in 60 s"
            continue
        if probe.returncode == 0:
            return prefix, None
        lines = [line for line in probe.stderr.splitlines() if line.strip() and line.strip() != "Error:"]
        why = why or next((line for line in lines if "ermission" in line or "is limited" in line),
                          lines[0] if lines else "perf stat failed")
    return None, f"{why} (perf needs root, or kernel.perf_event_paranoid <= {0 if target else 1})"


def perf_report(data, pid, sort, limit=0.0):
    """[(percent, fields...)] of process `pid`'s samples from `perf report --sort <sort>`."""
    out = subprocess.run([*PERF, "report", "-i", data, "--pid", str(pid), "--stdio", "--no-children", "-q",
                          "-g", "none", "--sort", sort, "--percent-limit", str(limit)],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise BenchmarkError(f"perf report failed: {out.stderr.strip()}")
    rows = []
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) < 2 or not parts[0].endswith("%"):
            continue
        rows.append((float(parts[0][:-1]), parts[1:]))
    return rows


def profile_window(load, url, pid, cpu, request_file, concurrency, rate, frequency, data):
    """(load result, server CPU us per request) for one window; the samples go to `data`. With
    the server pinned, perf samples its CPU (`cpu`) rather than its threads: per-thread events
    make every context switch dearer (perf switches them in and out), and context switches are
    a large part of what is measured here."""
    target = ["-C", str(cpu)] if cpu is not None else ["-p", str(pid)]
    # Its own session: sudo does not pass on a SIGINT sent from its own process group (older
    # sudo), and this process would otherwise be in it.
    perf = subprocess.Popen([*PERF, "record", "-e", "cpu-clock", "-F", str(frequency), *target,
                             "-o", data, "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    time.sleep(0.3)  # perf attaches to every thread of the process
    if perf.poll() is not None:
        raise BenchmarkError(f"perf record could not start: {perf.stderr.read().strip()} "
                             "(see perf_command)")
    before = cpu_seconds(pid)
    run = load.run(url, request_file, concurrency, rate=rate)
    after = cpu_seconds(pid)
    perf.send_signal(signal.SIGINT)
    try:
        perf.wait(timeout=60)
    except subprocess.TimeoutExpired:
        # (Through sudo, killing sudo would leave root's perf running: its whole session goes.)
        subprocess.run([*PERF[:-1], "kill", "-KILL", "--", f"-{perf.pid}"], capture_output=True, timeout=30)
        perf.wait(timeout=30)
        raise BenchmarkError("perf record did not stop within 60 s of its SIGINT")
    # Every call the client sent in warm-up and window ran on the server inside the perf window.
    calls = run["calls_per_s"] * run["seconds"] * (1 + load.warmup_s / run["seconds"])
    return run, (after - before) / calls * 1e6


def summarize(data, pid, cpu_us):
    by_thread, by_library = collections.Counter(), collections.Counter()
    for percent, fields in perf_report(data, pid, "comm,dso"):
        comm, dso = fields[0], fields[-1]
        by_thread[thread_group(comm)] += percent
        by_library[library_group(dso)] += percent
    total = sum(by_thread.values()) or 1.0
    # perf's percentages are of every sample on the CPU (idle included); shares are of the server's.
    symbols = [{"share": percent / total, "us_per_request": percent / total * cpu_us, "dso": fields[0],
                "symbol": " ".join(fields[2:]) if len(fields) > 2 else fields[-1]}
               for percent, fields in perf_report(data, pid, "dso,sym", limit=0.2)[:25]]
    scale = cpu_us / total
    return {
        "cpu_us_per_request": cpu_us,
        "threads_us": {k: v * scale for k, v in by_thread.most_common()},
        "libraries_us": {k: v * scale for k, v in by_library.most_common()},
        "top_symbols": symbols,
    }


def print_tables(report):
    windows = report["windows"]
    names = list(windows)
    print(f"\npinning: {report['pinning']}; server CPU per request, us, split by perf samples")
    print(f"{'':24}" + "".join(f"{name:>14}" for name in names))
    print(f"{'total (from /proc)':24}" + "".join(f"{windows[n]['cpu_us_per_request']:>14.1f}" for n in names))
    for part in ("threads_us", "libraries_us"):
        keys = []
        for name in names:
            keys += [k for k in windows[name][part] if k not in keys]
        print(f"by {'thread' if part == 'threads_us' else 'library'}:")
        for key in keys:
            print(f"  {key:22}" + "".join(f"{windows[n][part].get(key, 0.0):>14.1f}" for n in names))
    for name in names:
        print(f"\n{name}: top symbols (us per request, share of the server's samples)")
        for row in windows[name]["top_symbols"][:15]:
            print(f"  {row['us_per_request']:7.1f}  {row['share']:6.1%}  {row['dso']:24.24} {row['symbol'][:70]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per window")
    parser.add_argument("--frequency", type=int, default=4000, help="perf samples per second")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    if shutil.which("perf") is None:
        print("request path profile: perf is not installed (Debian: linux-perf)", file=sys.stderr)
        return 1
    windows = (0.1, 0.3) if args.smoke else (1.0, args.seconds)
    (server_prefix, client_prefix), pin_note = pinning(not args.no_pin)
    server_cpu = int(server_prefix[-1]) if server_prefix else None
    global PERF
    PERF, why_not = perf_command(server_cpu)
    if PERF is None:
        print(f"request path profile: perf cannot sample here: {why_not}", file=sys.stderr)
        # CI sets SLUICE_REQUIRE_PERF: its machines can, so there a smoke that cannot fails.
        return SKIPPED if args.smoke and not os.environ.get("SLUICE_REQUIRE_PERF") else 1
    started = time.monotonic()
    report = {"benchmark": "request_path_profile", "smoke": args.smoke, "pinning": pin_note,
              "window_seconds": windows[1], "fixed_rate": FIXED_RATE, "windows": {}}
    with tempfile.TemporaryDirectory(prefix="sluice-profile-") as workdir:
        repository, request_files = make_mlp_addsub(workdir)
        load = Load(args.bin_dir, client_prefix, workdir, windows)
        try:
            with Server(os.path.join(args.bin_dir, "sluice-server"), repository,
                        os.path.join(workdir, "server.log"), prefix=server_prefix) as server:
                # The windows share every code path: a smoke run profiles the last one only.
                for name, model, concurrency, rate in (WINDOWS[-1:] if args.smoke else WINDOWS):
                    data = os.path.join(workdir, f"{name}.perf")
                    run, cpu_us = profile_window(load, server.url, server.process.pid, server_cpu,
                                                 request_files[model], concurrency, rate, args.frequency, data)
                    report["windows"][name] = {"requests_per_s": run["calls_per_s"], "p50_us": run["p50_us"],
                                               "client_cpu_busy": run["client_cpu_busy"],
                                               **summarize(data, server.process.pid, cpu_us)}
        except BenchmarkError as error:
            print(f"request path profile failed: {error}", file=sys.stderr)
            return 1
    report["elapsed_s"] = time.monotonic() - started
    print_tables(report)
    if args.json:
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
