"""The per-request figures of benchmarks/floor_benchmark.py (issue 20) on this machine, with that
benchmark's own load driver: the bare gRPC echo (sluice-bench-echo, callback API) against
sluice-server serving the bundled MLP on the GPU, driven by the same C++ load client
(sluice-bench-load) with the same request bytes. Per side: p50 at concurrency 1, requests/s at 32,
and server CPU per request at a fixed 2,000/s; with in-process LibTorch at batch 1 and at the
batch the server formed (the model alone, and with the host staging and copies a request needs),
the c=1 overhead and the c=32 cost ratio.

How the worker waits for the GPU is measured, not assumed: CUDA's default schedule
(cudaDeviceScheduleAuto) spins while the process has no more contexts than CPUs, so a server
pinned to one CPU pays the whole GPU time in CPU. The same MLP is served with sluice.cuda_wait
"spin" (the default) and "blocking" (a blocking-sync event: the thread sleeps), pinned to one
CPU and unpinned: the CPU per request and the c=1 p50 of each are the trade-off. The CPU dry run
serves the MLP on the CPU with tiny windows (the wait mode changes nothing there)."""
# kit-timeout: 100
import os
import shutil

import floor_benchmark as fb
import kitlib
from harness.bench import pinning

BLOCKING = 'parameters { key: "sluice.cuda_wait" value { string_value: "blocking" } }\n'


def request_file_for(model, directory):
    """The MLP's request (floor_benchmark's bytes) addressed to `model`."""
    from tritonclient.grpc import service_pb2
    request = service_pb2.ModelInferRequest.FromString(fb.request_bytes("mlp"))
    request.model_name = model
    path = os.path.join(directory, f"{model}.request")
    with open(path, "wb") as f:
        f.write(request.SerializeToString())
    return path


def body():
    windows = (0.1, 0.3) if kitlib.NO_GPU else (0.5, 3.0)
    root = os.path.join(kitlib.WORK, "request_floor")
    shutil.rmtree(root, ignore_errors=True)
    kitlib.write_bundled(root, ["mlp"], "dynamic_batching { }")
    shutil.copytree(os.path.join(root, "mlp"), os.path.join(root, "mlp_blocking"))
    config_path = os.path.join(root, "mlp_blocking", "config.pbtxt")
    with open(config_path) as f:
        config = f.read().replace('name: "mlp"', 'name: "mlp_blocking"')
    with open(config_path, "w") as f:
        f.write(config + BLOCKING)
    files = {model: request_file_for(model, kitlib.STEP_DIR) for model in ("mlp", "mlp_blocking")}
    (server_prefix, client_prefix), pin_note = pinning(True)
    load = fb.Load(kitlib.BIN, client_prefix, kitlib.STEP_DIR, windows, timeout=30)
    numbers = {"pinning": pin_note, "cuda_wait_default": "cudaDeviceScheduleAuto (spin while contexts <= CPUs)",
               "cpus": os.cpu_count()}

    echo = {}
    fb.measure_echo(kitlib.BIN, "callback", (server_prefix, client_prefix), load, files["mlp"], echo)
    echo = {window: echo[f"echo_callback_{window}"][0] for window in ("c1", "c32", "fixed")}
    numbers["echo"] = echo
    kitlib.write_result("fail", "cut short after the echo", numbers)

    sides, codes = {}, []
    for placement, prefix in (("pinned", server_prefix), ("unpinned", ())):
        # Started pinned, so that it sizes its CPU thread pools for the one CPU it has.
        server = kitlib.start_server(root, ["--device", kitlib.device()], timeout=60, prefix=prefix,
                                     name=f"server_{placement}")
        try:
            for model in ("mlp", "mlp_blocking"):
                runs = {"c1": load.run(server.url, files[model], 1)}
                if placement == "pinned" and model == "mlp":
                    before = kitlib.model_statistics(server.url, "mlp")
                    runs["c32"] = load.run(server.url, files[model], 32)
                    after = kitlib.model_statistics(server.url, "mlp")
                runs["fixed"] = load.run(server.url, files[model], 32, rate=fb.FIXED_RATE, server_pid=server.process.pid)
                sides[f"{model}_{placement}"] = runs
                numbers["sluice"] = sides
                kitlib.write_result("fail", f"cut short after {model} {placement}", numbers)
        finally:
            codes.append(server.stop())
    sluice = sides["mlp_pinned"]
    delta = kitlib.statistics_delta(after, before)
    formed = delta["inferences"] / max(delta["executions"], 1)
    sizes = sorted({1, max(1, round(formed))})
    both = kitlib.ceilings(os.path.join(root, "mlp", "1", "model.pt"), [784], sizes, 0.2 if kitlib.NO_GPU else 1)
    ceiling, with_copies = both["model"], both["with_copies"]
    per_row_us = 1e6 / ceiling[sizes[-1]]["rows_per_s"]
    numbers.update({
        "inprocess": both, "formed_batch": formed, "server_exits": codes,
        "c1_overhead_us": sluice["c1"]["p50_us"] - echo["c1"]["p50_us"] - ceiling[1]["p50_us"],
        "c1_overhead_with_copies_us": sluice["c1"]["p50_us"] - echo["c1"]["p50_us"] - with_copies[1]["p50_us"],
        "c32_cost_ratio": (1 / sluice["c32"]["calls_per_s"]) / (1 / echo["c32"]["calls_per_s"] + per_row_us / 1e6),
        "wait_cpu_us_per_request": {placement: round(sides[f"mlp_{placement}"]["fixed"]["server_cpu_us_per_call"]
                                                     - sides[f"mlp_blocking_{placement}"]["fixed"]["server_cpu_us_per_call"], 1)
                                    for placement in ("pinned", "unpinned")},
        "blocking_c1_p50_cost_us": {placement: round(sides[f"mlp_blocking_{placement}"]["c1"]["p50_us"]
                                                     - sides[f"mlp_{placement}"]["c1"]["p50_us"], 1)
                                    for placement in ("pinned", "unpinned")},
    })
    rows = [["echo (callback)", round(echo["c1"]["p50_us"]), round(echo["c32"]["calls_per_s"]),
             round(echo["fixed"]["server_cpu_us_per_call"], 1)]]
    for key, runs in sides.items():
        rows.append([key.replace("_", " "), round(runs["c1"]["p50_us"]),
                     round(runs["c32"]["calls_per_s"]) if "c32" in runs else "",
                     round(runs["fixed"]["server_cpu_us_per_call"], 1)])
    details = kitlib.table(["server", "c=1 p50 us", "c=32 req/s", f"CPU us/req at {fb.FIXED_RATE}/s"], rows)
    details += (f"\n\nPinning: {pin_note} (unpinned: the server on any CPU). In-process ({kitlib.device()}): batch 1 "
                f"p50 {ceiling[1]['p50_us']:.0f} us alone, {with_copies[1]['p50_us']:.0f} us with staging and copies; "
                f"{per_row_us:.1f} us per row at batch {sizes[-1]} (the server formed {formed:.1f}).\n"
                f"c=1 overhead (Sluice p50 - echo p50 - in-process p50): {numbers['c1_overhead_us']:.0f} us against the "
                f"model alone, {numbers['c1_overhead_with_copies_us']:.0f} us against the model with copies "
                f"(issue 20's target: <= 10); c=32 cost ratio {numbers['c32_cost_ratio']:.2f} (<= 1.15).\n"
                f"CUDA wait: spin - blocking CPU per request {numbers['wait_cpu_us_per_request']} us; blocking's c=1 p50 "
                f"cost {numbers['blocking_c1_p50_cost_us']} us.")
    summary = (f"MLP on {kitlib.device()}: c=1 p50 {sluice['c1']['p50_us']:.0f} us against the echo's "
               f"{echo['c1']['p50_us']:.0f} (+{numbers['c1_overhead_with_copies_us']:.0f} us over echo + forward with "
               f"copies); c=32 {sluice['c32']['calls_per_s']:.0f}/s, cost ratio {numbers['c32_cost_ratio']:.2f}; "
               f"spin costs {numbers['wait_cpu_us_per_request']['pinned']} CPU us/request pinned over blocking")
    return kitlib.gpu_outcome(all(code == 0 for code in codes), summary, numbers, details)


if __name__ == "__main__":
    kitlib.run_step(body)
