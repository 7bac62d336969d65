"""The per-request figures of benchmarks/floor_benchmark.py (issue 20) on this machine, with that
benchmark's own load driver: the bare gRPC echo (sluice-bench-echo, callback API) against
sluice-server serving the bundled MLP on the GPU, driven by the same C++ load client
(sluice-bench-load) with the same request bytes, the server on one CPU and the client on another.
Per side: p50 at concurrency 1, requests/s at 32, and server CPU per request at a fixed 2,000/s;
with in-process LibTorch at batch 1 and at the batch the server formed (sluice-bench-inprocess on
the same device), the c=1 overhead and the c=32 cost ratio. The CPU dry run serves the MLP on the
CPU with tiny windows."""
# kit-timeout: 90
import os
import shutil

import floor_benchmark as fb
import kitlib
from batching_benchmark import pinning


def body():
    windows = (0.1, 0.3) if kitlib.NO_GPU else (1.0, 4.0)
    root = os.path.join(kitlib.WORK, "request_floor")
    shutil.rmtree(root, ignore_errors=True)
    kitlib.write_bundled(root, ["mlp"], "dynamic_batching { }")
    request_file = fb.write_request_files(kitlib.STEP_DIR, ("mlp",))["mlp"]
    (server_prefix, client_prefix), pin_note = pinning(True)
    load = fb.Load(kitlib.BIN, client_prefix, kitlib.STEP_DIR, windows)

    echo = {}
    fb.measure_echo(kitlib.BIN, "callback", (server_prefix, client_prefix), load, request_file, echo)
    echo = {window: echo[f"echo_callback_{window}"][0] for window in ("c1", "c32", "fixed")}

    # Started pinned, so that it sizes its CPU thread pools for the one CPU it has.
    server = kitlib.start_server(root, ["--device", kitlib.device()], timeout=90, prefix=server_prefix)
    try:
        sluice = {"c1": load.run(server.url, request_file, 1)}
        before = kitlib.model_statistics(server.url, "mlp")
        sluice["c32"] = load.run(server.url, request_file, 32)
        after = kitlib.model_statistics(server.url, "mlp")
        sluice["fixed"] = load.run(server.url, request_file, 32, rate=fb.FIXED_RATE, server_pid=server.process.pid)
    finally:
        code = server.stop()
    delta = kitlib.statistics_delta(after, before)
    formed = delta["inferences"] / max(delta["executions"], 1)
    sizes = sorted({1, max(1, round(formed))})
    ceiling = kitlib.inprocess(os.path.join(root, "mlp", "1", "model.pt"), [784], sizes,
                               0.2 if kitlib.NO_GPU else 2)
    per_row_us = 1e6 / ceiling[sizes[-1]]["rows_per_s"]
    numbers = {
        "pinning": pin_note, "echo": echo, "sluice": sluice, "inprocess": ceiling, "formed_batch": formed,
        "c1_overhead_us": sluice["c1"]["p50_us"] - echo["c1"]["p50_us"] - ceiling[1]["p50_us"],
        "c32_cost_ratio": (1 / sluice["c32"]["calls_per_s"]) / (1 / echo["c32"]["calls_per_s"] + per_row_us / 1e6),
        "server_exit": code,
    }
    rows = [[side, round(runs["c1"]["p50_us"]), round(runs["c32"]["calls_per_s"]),
             round(runs["fixed"]["server_cpu_us_per_call"], 1),
             f"{runs['c32']['client_cpu_busy']:.0%}" + ("" if runs["c32"]["valid"] else " (client-bound)")]
            for side, runs in (("echo (callback)", echo), ("sluice mlp", sluice))]
    details = kitlib.table(["server", "c=1 p50 us", "c=32 req/s", f"CPU us/req at {fb.FIXED_RATE}/s",
                            "client CPU at c=32"], rows)
    details += (f"\n\nPinning: {pin_note}. In-process ({kitlib.device()}): batch 1 p50 {ceiling[1]['p50_us']:.0f} us; "
                f"{per_row_us:.1f} us per row at batch {sizes[-1]} (the server formed {formed:.1f}).\n"
                f"c=1 overhead (Sluice p50 - echo p50 - in-process p50): {numbers['c1_overhead_us']:.0f} us "
                f"(issue 20's target: <= 10); c=32 cost ratio {numbers['c32_cost_ratio']:.2f} (<= 1.15).")
    summary = (f"MLP on {kitlib.device()}: c=1 p50 {sluice['c1']['p50_us']:.0f} us against the echo's "
               f"{echo['c1']['p50_us']:.0f} (+{numbers['c1_overhead_us']:.0f} us over echo + forward); "
               f"c=32 {sluice['c32']['calls_per_s']:.0f}/s, cost ratio {numbers['c32_cost_ratio']:.2f}")
    return kitlib.gpu_outcome(code == 0, summary, numbers, details)


kitlib.run_step(body)
