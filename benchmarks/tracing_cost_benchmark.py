#!/usr/bin/env python3
"""What request tracing costs per request: instructions counted by valgrind's callgrind, the same
fixed number of requests sent to a server with tracing off, with every request traced (level
TIMESTAMPS, rate 1, spans exported over OTLP/HTTP to a receiver in this process; "on" with the
exporter's defaults, "on_100ms" posting every 100 ms, about once per request here), and, when
--baseline-bin-dir names the binaries of the commit before tracing, to that server.

    .venv/bin/python benchmarks/tracing_cost_benchmark.py [--smoke] [--json out.json] [--requests N]
        [--baseline-bin-dir DIR]

As in metrics_cost_benchmark.py: sluice-server runs under callgrind with instrumentation off (the
bundled MLP, one intra-op thread, no warm-up, on the CPU); after `--warm` requests, the counters
are zeroed, `--requests` single-row requests are sent one at a time by tritonclient (this process,
not counted), and the window stays open 5.5 s longer in every mode, so that the exporter's last
batch (default delay 5 s) is counted too and the idle threads' periodic work counts alike. Every thread of the server is counted: gRPC, the worker, the forward pass, and with
tracing on the spans' bookkeeping, their encoding and the HTTP posts.

Targets: tracing off / before below 1.01 instructions per request (tracing off costs nothing
measurable); tracing on / off is measured and stated. Prints a table, writes JSON. --smoke runs a
tiny version (the test command runs it so the script keeps working): tracing on only, without
valgrind (each start under valgrind costs the test command about 35 s), no ratio.
"""
import http.server
import os
import sys
import tempfile
import threading


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from harness.bench import write_json  # noqa: E402
from harness import callgrind  # noqa: E402

TARGET_OFF_RATIO = 1.01


class Receiver:
    """An OTLP/HTTP endpoint that answers 200 and counts the bytes and posts it got."""

    def __init__(self):
        self.posts = 0
        self.bytes = 0
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.posts += 1
                receiver.bytes += len(body)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def measure(mode, bin_dir, repository, requests, warm, workdir, receiver, smoke=False):
    sender = callgrind.MlpRows()
    args = ["--metrics-address", "127.0.0.1", "--allow-http", "false", "--warmup", "false", "--device", "cpu"]
    # Every mode's window stays open as long after the last request: the default export delay
    # (5 s) and a little more, so that the last partial batch is counted, and the idle threads'
    # periodic work counts the same in every row.
    settle = 0.5 if smoke else 5.5
    if mode.startswith("on"):
        args += ["--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
                 "--trace-config", f"opentelemetry,url={receiver.url}"]
    if mode == "on_100ms":
        args += ["--trace-config", "opentelemetry,bsp_schedule_delay=100"]
    posts_before = receiver.posts
    counted = callgrind.count_requests(os.path.join(bin_dir, "sluice-server"), repository, args,
                                       os.path.join(workdir, f"callgrind.{mode}"), requests, warm, sender.send, settle=settle,
                                       valgrind=not smoke)
    sender.close()
    return {"mode": mode, "requests": requests, "instructions": counted["instructions"],
            "instructions_per_request": counted["instructions_per_request"],
            "seconds_under_valgrind": counted["seconds"], "otlp_posts": receiver.posts - posts_before}


def main():
    parser = callgrind.cost_arguments(__doc__, "tracing_cost")
    parser.add_argument("--baseline-bin-dir", help="bin/ of the commit before tracing (adds the 'before' row)")
    args = parser.parse_args()
    callgrind.require_valgrind()
    requests, warm = (5, 2) if args.smoke else (args.requests, args.warm)
    receiver = Receiver()
    with tempfile.TemporaryDirectory() as workdir:
        repository = callgrind.MlpRows.write_repository(os.path.join(workdir, "models"))
        runs = [("on_100ms", args.bin_dir)] if args.smoke else [
            ("off", args.bin_dir), ("on", args.bin_dir), ("on_100ms", args.bin_dir)]
        if args.baseline_bin_dir and not args.smoke:
            runs.insert(0, ("before", args.baseline_bin_dir))
        rows = [measure(mode, bin_dir, repository, requests, warm, workdir, receiver, smoke=args.smoke)
                for mode, bin_dir in runs]
    receiver.server.shutdown()
    if args.smoke:
        print(f"\nsmoke: {requests} requests with tracing on, {rows[0]['otlp_posts']} OTLP posts (not under "
              "valgrind: metrics_cost_benchmark's smoke run covers the counting; no off run, no ratio)")
        assert rows[0]["otlp_posts"] > 0, "tracing on exported nothing"
        write_json(args.json, {"benchmark": "tracing_cost", "smoke": True, "rows": rows})
        return
    by_mode = {row["mode"]: row for row in rows}
    per = {mode: row["instructions_per_request"] for mode, row in by_mode.items()}
    print(f"\nTracing cost, instructions per request (callgrind, bundled MLP, batch 1, {requests} requests)")
    print(f"{'tracing':8} {'instructions':>14} {'per request':>12} {'OTLP posts':>10}")
    for row in rows:
        print(f"{row['mode']:8} {row['instructions']:14d} {row['instructions_per_request']:12.0f} {row['otlp_posts']:10d}")
    result = {"benchmark": "tracing_cost", "smoke": False, "target_off_ratio": TARGET_OFF_RATIO, "rows": rows,
              "ratio_on_off": per["on"] / per["off"]}
    result["ratio_on_100ms_off"] = per["on_100ms"] / per["off"]
    for mode in ("on", "on_100ms"):
        print(f"{mode} / off = {per[mode] / per['off']:.4f}: +{per[mode] - per['off']:.0f} instructions per traced "
              "request (5 spans: request, queue, compute, output, batch)")
    if "before" in per:
        result["ratio_off_before"] = per["off"] / per["before"]
        met = result["ratio_off_before"] < TARGET_OFF_RATIO
        print(f"off / before = {result['ratio_off_before']:.4f} (target < {TARGET_OFF_RATIO}; "
              f"{'met' if met else 'not met'}), {per['off'] - per['before']:+.0f} instructions per request")
    write_json(args.json, result)


if __name__ == "__main__":
    main()
