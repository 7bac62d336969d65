"""An ensemble's tensors between steps on the GPU: the bundled convnet_pipeline (image_normaliser ->
convnet -> top_classes, every model on the GPU) asked one request at a time, then from 8 threads
at once. Reads sluice_ensemble_copied_bytes_total (path="device": copies within the GPU's memory;
path="host": copies between the GPU and the host) around each phase, and compares every answer with
the three model.pt files run one after the other by torch on the same GPU. Pass: every answer
equal (classes) and within the FP32 tolerance (scores); one request at a time, zero bytes copied
between steps on either path (each step reads the tensor the step before left on the GPU; a batch
padded by the warm-up's batch size ladder gathers once on the device, reported); under
concurrency, zero through the host (a step batched with other requests gathers their rows once, on
the GPU: reported per request, not judged); the server exits 0. Then the same pipeline with its
last step on a CPU instance (top_classes_cpu), one request at a time: every answer equal, the
logits crossing to the host counted through the host and nothing on the device (the GPU's tensor
read by a CPU model, which must wait for it). CPU dry run: the same on the CPU (the tensors stay in
LibTorch's host memory, nothing crosses) with fewer requests."""
# kit-timeout: 45
import concurrent.futures
import os
import shutil
import time

import numpy as np
import torch

import kitlib

MODELS = ["image_normaliser", "convnet", "top_classes", "convnet_pipeline"]
STEPS = ["image_normaliser", "convnet", "top_classes"]
REQUEST_TIMEOUT_S = 10


def copied(server, model="convnet_pipeline"):
    text = kitlib.scrape(server.metrics_port)
    return {path: sum(kitlib.metric_values(text, "sluice_ensemble_copied_bytes_total", model=model, path=path))
            for path in ("device", "host")}


def body():
    from harness.repository import KEEP
    root = os.path.join(kitlib.WORK, "ensemble_on_device")
    shutil.rmtree(root, ignore_errors=True)
    kitlib.write_bundled(root, MODELS, KEEP)
    kitlib.copy_model(root, "top_classes", "top_classes_cpu", [(r"KIND_GPU", "KIND_CPU")])
    kitlib.copy_model(root, "convnet_pipeline", "pipeline_cpu_head",
                 [(r'model_name:\s*"top_classes"', 'model_name: "top_classes_cpu"')])
    alone, threads, per_thread, head_requests = (5, 4, 5, 3) if kitlib.NO_GPU else (40, 8, 25, 10)
    rng = np.random.default_rng(75)
    numbers, failures = {"device": kitlib.device()}, []
    answers = []  # (pixels, scores, classes)

    server = kitlib.start_server(root, ["--device", kitlib.device()], timeout=60)
    try:
        import tritonclient.grpc as grpcclient

        def one(pixels, model="convnet_pipeline"):
            client = grpcclient.InferenceServerClient(url=server.url)
            try:
                given = grpcclient.InferInput("pixels", list(pixels.shape), "FP32")
                given.set_data_from_numpy(pixels)
                started = time.perf_counter()
                result = client.infer(model, [given], client_timeout=REQUEST_TIMEOUT_S)
                took = (time.perf_counter() - started) * 1e6
                return pixels, result.as_numpy("scores"), result.as_numpy("classes"), took
            finally:
                client.close()

        before = copied(server)
        readers_before = {name: kitlib.model_statistics(server.url, name) for name in STEPS[1:]}
        latencies = []
        for _ in range(alone):
            pixels, scores, classes, took = one(rng.uniform(0, 255, (1, 3, 32, 32)).astype(np.float32))
            answers.append((pixels, scores, classes))
            latencies.append(took)
        after_alone = copied(server)
        # A lone request's step runs on the tensor itself unless its batch was padded (a batch
        # size ladder chosen at warm-up may pad): then its rows are gathered once on the device.
        padded = {name: sizes for name in STEPS[1:]
                  for sizes in [kitlib.statistics_delta(kitlib.model_statistics(server.url, name),
                                                        readers_before[name])["batch_sizes"]]
                  if any(int(size) > 1 for size in sizes)}
        numbers["alone"] = {"requests": alone, "p50_us": round(kitlib.median(latencies)),
                            "padded_batches": padded,
                            "copied_device_bytes": after_alone["device"] - before["device"],
                            "copied_host_bytes": after_alone["host"] - before["host"]}
        kitlib.write_result("fail", "cut short after the requests one at a time", numbers)

        convnet_before = kitlib.model_statistics(server.url, "convnet")
        jobs = [rng.uniform(0, 255, (1, 3, 32, 32)).astype(np.float32) for _ in range(threads * per_thread)]
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            for pixels, scores, classes, _ in pool.map(one, jobs):
                answers.append((pixels, scores, classes))
        after = copied(server)
        delta = kitlib.statistics_delta(kitlib.model_statistics(server.url, "convnet"), convnet_before)
        numbers["together"] = {"threads": threads, "requests": len(jobs),
                               "convnet_rows_per_execution": delta["inferences"] / max(delta["executions"], 1),
                               "copied_device_bytes_per_request": (after["device"] - after_alone["device"]) / len(jobs),
                               "copied_host_bytes": after["host"] - after_alone["host"]}
        kitlib.write_result("fail", "cut short after the concurrent requests", numbers)

        head_before = copied(server, "pipeline_cpu_head")
        for _ in range(head_requests):
            pixels, scores, classes, _ = one(rng.uniform(0, 255, (1, 3, 32, 32)).astype(np.float32),
                                             "pipeline_cpu_head")
            answers.append((pixels, scores, classes))
        head_after = copied(server, "pipeline_cpu_head")
        numbers["cpu_head"] = {"requests": head_requests,
                               "copied_device_bytes": head_after["device"] - head_before["device"],
                               "copied_host_bytes_per_request":
                                   (head_after["host"] - head_before["host"]) / head_requests}
    finally:
        code = server.stop()

    device = kitlib.torch_device()
    models = [torch.jit.load(os.path.join(root, name, "1", "model.pt"), map_location=device).eval() for name in STEPS]
    rtol, atol = kitlib.TOLERANCE["FP32"]
    for index, (pixels, scores, classes) in enumerate(answers):
        with torch.inference_mode():
            value = torch.from_numpy(pixels).to(device)
            for model in models[:-1]:
                value = model(value)
            want_scores, want_classes = (t.cpu().numpy() for t in models[-1](value))
        if not np.array_equal(classes, want_classes) or not np.allclose(scores, want_scores, rtol=rtol, atol=atol):
            failures.append(f"request {index}: classes {classes.tolist()} scores {scores.tolist()} != "
                            f"{want_classes.tolist()} {want_scores.tolist()}")
    alone_numbers = numbers["alone"]
    if alone_numbers["copied_host_bytes"] != 0 or (alone_numbers["copied_device_bytes"] != 0
                                                   and not alone_numbers["padded_batches"]):
        failures.append(f"one request at a time, bytes were copied between steps (device "
                        f"{alone_numbers['copied_device_bytes']:.0f}, host {alone_numbers['copied_host_bytes']:.0f}) "
                        "with no batch padded; expected none")
    if numbers["together"]["copied_host_bytes"] != 0:
        failures.append(f"under concurrency {numbers['together']['copied_host_bytes']:.0f} bytes went through "
                        "the host between steps; expected none")
    head = numbers["cpu_head"]
    if head["copied_device_bytes"] != 0:
        failures.append(f"with the last step on the CPU, {head['copied_device_bytes']:.0f} bytes were copied on the "
                        "device; expected none")
    if not kitlib.NO_GPU and head["copied_host_bytes_per_request"] <= 0:
        failures.append("with the last step on the CPU, no byte crossed to the host: the GPU's logits must")
    if code != 0:
        failures.append(f"the server exited {code}")
    numbers["failures"] = failures[:20]
    together = numbers["together"]
    details = kitlib.table(
        ["phase", "requests", "copied on the device (bytes)", "through the host (bytes)", "note"],
        [["one at a time", alone, f"{numbers['alone']['copied_device_bytes']:.0f}",
          f"{numbers['alone']['copied_host_bytes']:.0f}", f"p50 {numbers['alone']['p50_us'] / 1e3:.2f} ms"],
         [f"{threads} threads", together["requests"], f"{together['copied_device_bytes_per_request']:.0f} per request",
          f"{together['copied_host_bytes']:.0f}",
          f"convnet {together['convnet_rows_per_execution']:.2f} rows per execution"],
         ["last step on the CPU", head["requests"], f"{head['copied_device_bytes']:.0f}",
          f"{head['copied_host_bytes_per_request']:.0f} per request", "logits read by a CPU model"]])
    if failures:
        return kitlib.gpu_outcome(False, f"{len(failures)} problem(s): {failures[0]}"[:400], numbers, details)
    return kitlib.gpu_outcome(
        True, f"{len(answers)} ensemble answers equal torch on {device}; one at a time "
              + (f"{alone_numbers['copied_device_bytes'] / alone:.0f} bytes per request gathered on the device "
                 f"(padded batches {alone_numbers['padded_batches']})" if alone_numbers["padded_batches"]
                 else "no byte copied between steps")
              + f"; from {threads} threads {together['copied_device_bytes_per_request']:.0f} bytes per request "
              f"gathered on the device, none through the host; a CPU last step read "
              f"{head['copied_host_bytes_per_request']:.0f} bytes per request through the host", numbers, details)


if __name__ == "__main__":
    kitlib.run_step(body)
