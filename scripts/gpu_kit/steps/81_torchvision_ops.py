"""torchvision's operators on the GPU, with no configuration: the server's bundled
torchvision_ops.so (the torch wheel's torchvision, without Python) serves a model that calls nms,
roi_align, roi_pool, ps_roi_align, ps_roi_pool and deform_conv2d, and a torchvision Faster R-CNN
(mobilenet_v3_large_320_fpn, random weights, box_score_thresh=0), both KIND_GPU on --device cuda.
Every answer is compared with the same scripted module run by this machine's torch and torchvision
on the same GPU (nms's kept indices and the labels equal, floats within the FP32 tolerance). Pass:
the server lists the bundled library, both models load, every answer agrees. Reports each model's
latency (p50 over a few requests) and the server's start to ready. CPU dry run: the same on the
CPU."""
# kit-timeout: 120
import os
import shutil
import time

import numpy as np
import torch

import kitlib
from vision_models import DETECTOR_CONFIG, VISION_CONFIG, VISION_OUTPUTS, Detector, VisionOps, config, vision_inputs

REQUESTS = 10


def write(root, name, text, module):
    os.makedirs(os.path.join(root, name, "1"), exist_ok=True)
    with open(os.path.join(root, name, "config.pbtxt"), "w") as f:
        f.write(config(text, "KIND_CPU" if kitlib.NO_GPU else "KIND_GPU"))
    module.save(os.path.join(root, name, "1", "model.pt"))


def body():
    import tritonclient.grpc as grpcclient
    root = os.path.join(kitlib.WORK, "torchvision_ops")
    shutil.rmtree(root, ignore_errors=True)
    vision, detector = torch.jit.script(VisionOps()), torch.jit.script(Detector().eval())
    write(root, "vision", VISION_CONFIG, vision)
    write(root, "detector", DETECTOR_CONFIG, detector)
    image = np.random.default_rng(5).uniform(0, 1, size=(3, 240, 320)).astype(np.float32)
    cases = {"vision": (vision_inputs(), VISION_OUTPUTS),
             "detector": ({"IMAGE": image}, ["BOXES__0", "SCORES__1", "LABELS__2"])}
    numbers, failures, answers, latencies = {"device": kitlib.device()}, [], {}, {}

    started = time.monotonic()
    server = kitlib.start_server(root, ["--device", kitlib.device()], timeout=90)
    numbers["start_to_ready_s"] = round(time.monotonic() - started, 2)
    try:
        log = server.log()
        numbers["library_line"] = next((line for line in log.splitlines() if "event=operator_library_loaded" in line), "")
        if "library=torchvision_ops.so" not in numbers["library_line"]:
            failures.append("the server's log has no event=operator_library_loaded for torchvision_ops.so")
        client = grpcclient.InferenceServerClient(server.url)
        try:
            for model, (inputs, outputs) in cases.items():
                wire = []
                for name, value in inputs.items():
                    tensor = grpcclient.InferInput(name, list(value.shape), "FP32")
                    tensor.set_data_from_numpy(value)
                    wire.append(tensor)
                times = []
                for _ in range(REQUESTS):
                    t0 = time.perf_counter()
                    result = client.infer(model, wire, outputs=[grpcclient.InferRequestedOutput(o) for o in outputs])
                    times.append((time.perf_counter() - t0) * 1e3)
                answers[model] = [result.as_numpy(o) for o in outputs]
                latencies[model] = times
        finally:
            client.close()
        kitlib.write_result("fail", "cut short after the requests", numbers)
    finally:
        code = server.stop()
    if code != 0:
        failures.append(f"the server exited {code}")

    device = kitlib.torch_device()
    rtol, atol = kitlib.TOLERANCE["FP32"]
    modules = {"vision": vision.to(device), "detector": detector.to(device)}
    for model, (inputs, outputs) in cases.items():
        if model not in answers:
            failures.append(f"{model}: no answer")
            continue
        with torch.inference_mode():
            want = modules[model](*(torch.from_numpy(v).to(device) for v in inputs.values()))
        for name, got, expected in zip(outputs, answers[model], want):
            expected = expected.cpu().numpy()
            if got.shape != expected.shape:
                failures.append(f"{model} {name}: shape {got.shape} != {expected.shape}")
            elif got.dtype.kind in "iu":
                if not np.array_equal(got, expected):
                    failures.append(f"{model} {name}: differs from torch")
            elif not np.allclose(got, expected, rtol=rtol, atol=atol):
                failures.append(f"{model} {name}: max abs difference {np.max(np.abs(got - expected)):.3g}")
    numbers["detections"] = int(len(answers.get("detector", [[]])[0]))
    numbers["p50_ms"] = {model: round(kitlib.median(times), 2) for model, times in latencies.items()}
    numbers["failures"] = failures[:20]
    rows = [[model, REQUESTS, numbers["p50_ms"][model]] for model in latencies]
    details = (kitlib.table(["model", "requests", "p50 ms"], rows)
               + f"\n\n{numbers['library_line']}\n\nstart to ready {numbers['start_to_ready_s']} s; "
                 f"{numbers['detections']} detections")
    if failures:
        return kitlib.gpu_outcome(False, f"{len(failures)} problem(s): {failures[0]}"[:400], numbers, details)
    return kitlib.gpu_outcome(
        True, f"nms, roi_align, roi_pool, ps_roi_align, ps_roi_pool, deform_conv2d and a Faster R-CNN "
              f"({numbers['detections']} detections) equal torch on {device} through the bundled library "
              f"(p50 {numbers['p50_ms'].get('vision')} ms and {numbers['p50_ms'].get('detector')} ms)",
        numbers, details)


if __name__ == "__main__":
    kitlib.run_step(body)
