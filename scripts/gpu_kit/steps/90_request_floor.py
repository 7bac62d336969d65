"""The per-request figures of benchmarks/floor_benchmark.py (issue 20) on this machine: the bare
gRPC echo (sluice-bench-echo, callback API) against sluice-server serving the bundled MLP on the
GPU, driven by the same C++ load client (sluice-bench-load) with the same request bytes, the
server on CPU 0 and the client on CPU 1. Per side: p50 at concurrency 1, requests/s at 32, and
server CPU per request at a fixed 2,000/s; with in-process LibTorch at batch 1 and at the batch the
server formed (sluice-bench-inprocess on the same device), the c=1 overhead and the c=32 cost
ratio. The CPU dry run serves the MLP on the CPU with tiny windows."""
# kit-timeout: 90
import json
import os
import shutil
import subprocess

import kitlib

FIXED_RATE = 2000


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pinned(cpu):
    cpus = sorted(os.sched_getaffinity(0))
    return ["taskset", "-c", str(cpus[cpu])] if len(cpus) >= 2 and shutil.which("taskset") else []


def drive(url, request_file, concurrency, windows, rate=0, pid=None):
    """One sluice-bench-load window; with `pid` and a rate, the server's CPU us per request."""
    warmup_s, seconds = windows
    args = [*pinned(1), os.path.join(kitlib.BIN, "sluice-bench-load"), "--target", url, "--request-file",
            request_file, "--concurrency", str(concurrency), "--rate", str(rate), "--warmup-seconds", str(warmup_s),
            "--seconds", str(seconds)]
    before = cpu_seconds(pid) if pid else 0.0
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    after = cpu_seconds(pid) if pid else 0.0
    if result.returncode != 0:
        raise RuntimeError(f"sluice-bench-load exited {result.returncode}: {(result.stdout + result.stderr)[-600:]}")
    run = json.loads(result.stdout.strip().splitlines()[-1])
    if run["errors"]:
        raise RuntimeError(f"{run['errors']} failed calls against {url}: {run['first_error']}")
    if pid and rate:
        run["server_cpu_us"] = (after - before) / (rate * (warmup_s + run["seconds"])) * 1e6
    return run


def three_windows(url, request_file, windows, pid):
    return {"c1": drive(url, request_file, 1, windows), "c32": drive(url, request_file, 32, windows),
            "fixed": drive(url, request_file, 32, windows, rate=FIXED_RATE, pid=pid)}


def request_bytes():
    import numpy as np
    from tritonclient.grpc import service_pb2
    request = service_pb2.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="INPUT__0", datatype="FP32", shape=[1, 784])
    request.raw_input_contents.append(np.random.default_rng(7).random((1, 784), dtype=np.float32).tobytes())
    return request.SerializeToString()


def body():
    windows = (0.1, 0.3) if kitlib.NO_GPU else (1.0, 4.0)
    root = os.path.join(kitlib.WORK, "request_floor")
    shutil.rmtree(root, ignore_errors=True)
    kitlib.write_bundled(root, ["mlp"], "dynamic_batching { }")
    request_file = kitlib.step_path("mlp.request")
    with open(request_file, "wb") as f:
        f.write(request_bytes())

    echo = subprocess.Popen([*pinned(0), os.path.join(kitlib.BIN, "sluice-bench-echo"), "--api", "callback"],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = echo.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"sluice-bench-echo did not start: {line!r}")
        echo_runs = three_windows(f"127.0.0.1:{int(line.split()[-1])}", request_file, windows, echo.pid)
    finally:
        echo.terminate()
        echo.wait(timeout=10)

    # Started pinned, so that it sizes its CPU thread pools for the one CPU it has.
    server = kitlib.start_server(root, ["--device", kitlib.device()], timeout=90, prefix=pinned(0))
    try:
        sluice_runs = {"c1": drive(server.url, request_file, 1, windows)}
        mid = kitlib.model_statistics(server.url, "mlp")
        sluice_runs["c32"] = drive(server.url, request_file, 32, windows)
        after = kitlib.model_statistics(server.url, "mlp")
        sluice_runs["fixed"] = drive(server.url, request_file, 32, windows, rate=FIXED_RATE,
                                     pid=server.process.pid)
    finally:
        code = server.stop()
    delta = kitlib.statistics_delta(after, mid)
    formed = delta["inferences"] / max(delta["executions"], 1)
    sizes = sorted({1, max(1, round(formed))})
    ceiling = kitlib.inprocess(os.path.join(root, "mlp", "1", "model.pt"), [784], sizes,
                               0.2 if kitlib.NO_GPU else 2)
    per_row_us = 1e6 / ceiling[sizes[-1]]["rows_per_s"]
    numbers = {
        "echo": echo_runs, "sluice": sluice_runs, "inprocess": ceiling, "formed_batch": formed,
        "c1_overhead_us": sluice_runs["c1"]["p50_us"] - echo_runs["c1"]["p50_us"] - ceiling[1]["p50_us"],
        "c32_cost_ratio": (1 / sluice_runs["c32"]["calls_per_s"])
        / (1 / echo_runs["c32"]["calls_per_s"] + per_row_us / 1e6),
        "server_exit": code,
    }
    rows = [[side, round(runs["c1"]["p50_us"]), round(runs["c32"]["calls_per_s"]),
             round(runs["fixed"]["server_cpu_us"], 1), f"{runs['c32']['client_cpu_busy']:.0%}"]
            for side, runs in (("echo (callback)", echo_runs), ("sluice mlp", sluice_runs))]
    details = kitlib.table(["server", "c=1 p50 us", "c=32 req/s", f"CPU us/req at {FIXED_RATE}/s",
                            "client CPU at c=32"], rows)
    details += (f"\n\nIn-process ({kitlib.device()}): batch 1 p50 {ceiling[1]['p50_us']:.0f} us; "
                f"{per_row_us:.1f} us per row at batch {sizes[-1]} (the server formed {formed:.1f}).\n"
                f"c=1 overhead (Sluice p50 - echo p50 - in-process p50): {numbers['c1_overhead_us']:.0f} us "
                f"(issue 20's target: <= 10); c=32 cost ratio {numbers['c32_cost_ratio']:.2f} (<= 1.15).")
    passed = code == 0
    summary = (f"MLP on {kitlib.device()}: c=1 p50 {sluice_runs['c1']['p50_us']:.0f} us against the echo's "
               f"{echo_runs['c1']['p50_us']:.0f} (+{numbers['c1_overhead_us']:.0f} us over echo + forward); "
               f"c=32 {sluice_runs['c32']['calls_per_s']:.0f}/s, cost ratio {numbers['c32_cost_ratio']:.2f}")
    return kitlib.gpu_outcome(passed, summary, numbers, details)


kitlib.run_step(body)
