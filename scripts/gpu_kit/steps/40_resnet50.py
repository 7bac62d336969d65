"""ResNet-50 (torchvision, random weights, traced here) in FP32 and FP16, dynamic batching with
preferred sizes {1, 8, 32, 64} and padding to them, cuDNN benchmark mode on and off (one model
each, one server): warm-up time, and the first request after ready at each size against the
steady p50 at that size. Every shape was warmed up before ready, so on a GPU a first request
whose server compute (the forward pass, from the batch statistics) is more than FIRST_OVER_P50
times the steady compute at that size is a failure. The client's first/p50 is reported, not
judged: it includes the first transfer of a message that size (a batch of 64 FP32 images is
38.5 MB through gRPC), which warm-up cannot and need not remove. The numbers so far are written after each model, so a cap keeps them. The traced files
stay in WORK for the throughput step."""
# kit-timeout: 100
import os
import re
import shutil

import numpy as np

import kitlib

REQUESTS = 10
FIRST_OVER_P50 = 2.0  # warm-up ran every shape: the first forward pass must be about as fast as the rest


def body():
    import tritonclient.grpc as grpcclient
    arch, side, sizes, dtypes = kitlib.resnet_geometry()
    requests = 2 if kitlib.NO_GPU else REQUESTS
    root = os.path.join(kitlib.WORK, "resnet")
    shutil.rmtree(root, ignore_errors=True)
    models = {}
    for dtype in dtypes:
        for benchmark in ("on", "off"):
            name = f"{arch}_{dtype}_benchmark_{benchmark}"
            kitlib.write_resnet(root, name, dtype, sizes, benchmark, max_queue_delay_us=2000)
            models[name] = (dtype, benchmark)
    server = kitlib.start_server(root, ["--device", kitlib.device()], timeout=90)
    rows, failures = [], []
    try:
        client = grpcclient.InferenceServerClient(url=server.url)
        client.get_model_metadata(next(iter(models)))
        rng = np.random.default_rng(3)
        for name, (dtype, benchmark) in models.items():
            np_dtype = np.float16 if dtype == "fp16" else np.float32
            for batch in sizes:
                data = rng.standard_normal((batch, 3, side, side)).astype(np_dtype)
                tensor = grpcclient.InferInput("INPUT__0", list(data.shape), "FP16" if dtype == "fp16" else "FP32")
                tensor.set_data_from_numpy(data)
                before = kitlib.model_statistics(server.url, name)
                first, result = kitlib.timed_infer(client, name, [tensor])
                if result.as_numpy("OUTPUT__0").shape != (batch, 1000):
                    failures.append(f"{name} batch {batch}: output shape {result.as_numpy('OUTPUT__0').shape}")
                middle = kitlib.model_statistics(server.url, name)
                steady = kitlib.median([kitlib.timed_infer(client, name, [tensor])[0] for _ in range(requests)])
                delta = kitlib.statistics_delta(kitlib.model_statistics(server.url, name), middle)
                # The server's own time per forward pass (the batch statistics count each execution
                # once): a batch of 64 FP32 images is 38.5 MB through gRPC, which outweighs the
                # GPU's part of the client's latency.
                first_compute = kitlib.statistics_delta(middle, before)["batch_compute_ns"] / 1e3
                compute = delta["batch_compute_ns"] / max(delta["executions"], 1) / 1e3
                rows.append([name, dtype, benchmark, batch, round(first), round(steady), round(first / steady, 2),
                             round(first_compute), round(compute), round(first_compute / max(compute, 1e-3), 2)])
            kitlib.write_result("fail", f"cut short after {name}", {"rows": rows})
        client.close()
    finally:
        code = server.stop()
    if code != 0:
        failures.append(f"the server exited {code}")
    log = open(server.log_path).read()
    warmup_ms = {m.group(1): int(m.group(2)) for m in re.finditer(r"event=warmup model=(\w+) version=1 .*warmup_ms=(\d+)", log)}
    decisions = {m.group(1): m.group(2) for m in re.finditer(r"event=cudnn_benchmark model=(\w+) version=1 benchmark=(\w+)", log)}
    for name, (_, benchmark) in models.items():
        if decisions.get(name) != benchmark:
            failures.append(f"{name}: decision {decisions.get(name)} instead of {benchmark}")
        if name not in warmup_ms:
            failures.append(f"{name}: no warm-up line in the log")
    steady = {f"{r[0]}@{r[3]}": r[8] for r in rows}
    speedup = {}
    for dtype in dtypes:
        for batch in sizes:
            on, off = steady.get(f"{arch}_{dtype}_benchmark_on@{batch}"), steady.get(f"{arch}_{dtype}_benchmark_off@{batch}")
            if on and off:
                speedup[f"{dtype}@{batch}"] = round(off / on, 3)
    numbers = {"model": arch, "image_side": side, "warmup_ms": warmup_ms, "compute_off_over_on": speedup,
               "rows": [dict(zip(("model", "dtype", "benchmark", "batch", "first_us", "p50_us", "first_over_p50",
                                  "first_compute_us", "server_compute_us", "first_compute_over_steady"), r))
                        for r in rows]}
    details = ("Warm-up per model (ms): " + ", ".join(f"{k} {v}" for k, v in warmup_ms.items()) + "\n\n"
               + kitlib.table(["model", "dtype", "cuDNN benchmark", "batch", "first request us", "steady p50 us",
                               "first / p50", "first compute us", "steady compute us", "first / steady compute"],
                              rows)
               + "\n\nServer compute per forward pass, benchmark off / on (above 1: benchmark mode pays): "
               + ", ".join(f"{k} {v}" for k, v in speedup.items()))
    if not kitlib.NO_GPU:
        slow = [f"{r[0]}@{r[3]} {r[9]:.1f}x" for r in rows if r[9] > FIRST_OVER_P50]
        if slow:
            failures.append(f"first forward pass after ready over {FIRST_OVER_P50}x the steady one (warm-up "
                            f"missed a shape?): {', '.join(slow)}")
    if failures:
        return kitlib.gpu_outcome(False, "; ".join(failures)[:400], numbers, details)
    worst = max(r[9] for r in rows)
    return kitlib.gpu_outcome(True, f"{arch} {'/'.join(dtypes)} at {list(sizes)}: warm-up "
                              + ", ".join(f"{k.split('_', 1)[1]} {v} ms" for k, v in warmup_ms.items())
                              + f"; worst first/steady compute {worst:.2f}; compute off/on {speedup}", numbers, details)


if __name__ == "__main__":
    kitlib.run_step(body)
