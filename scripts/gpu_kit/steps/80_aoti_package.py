"""An AOTInductor package compiled on the GPU and served: the bundled MLP exported with
models/sluice_export.py for cuda (model.cuda.pt2, batch 1..64), served with dynamic batching on
--device cuda, its answers (concurrent, 1 to 3 rows each) compared with the same package run by
torch in Python (torch._inductor.aoti_load_package) on the same GPU. Reports the compile time and
the server's load time. The compile needs a C++ compiler, the CUDA toolkit's headers and Triton on
this machine: each is looked for first, and a missing one is reported as `skipped: <what>`; the
compile runs in its own process under COMPILE_CAP seconds. Last in the kit's order: it is the
slowest step. The CPU dry run does the same with the CPU package (cached by the tests)."""
# kit-timeout: 140
import os
import queue
import re
import shutil
import sys
import time

import numpy as np
import torch

import kitlib

sys.path.insert(0, os.path.join(kitlib.KIT, "src", "models"))
import generate_models  # noqa: E402

COMPILE_CAP = 100  # seconds; below the step's cap, with room to serve and compare

CONFIG = """name: "mlp_aoti"
platform: "torch_aoti"
max_batch_size: 64
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 784 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 10 ] } ]
instance_group [ { kind: %s count: 2 } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
"""


def missing_compile_tools():
    """What an AOTInductor compile for CUDA needs and this machine lacks."""
    missing = []
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not compiler:
        missing.append("no C++ compiler (c++, g++ or clang++ on PATH, or CXX)")
    from torch.utils import cpp_extension
    home = cpp_extension.CUDA_HOME
    if not home or not os.path.exists(os.path.join(home, "include", "cuda_runtime.h")):
        missing.append(f"no CUDA toolkit headers (CUDA_HOME {home or 'not found'}: no include/cuda_runtime.h)")
    try:
        import triton  # noqa: F401
    except ImportError as error:
        missing.append(f"no Triton ({error})")
    return missing


def serve_anyway(root):
    """What the server makes of a package the recipe compiled and then refused (its batch probe
    failed or crashed in a child process): on 2026-12-04 an H200's compile of this package
    crashed with SIGSEGV loading it, and whether the server's loader does the same is the
    question an operator has. The server's log stays in the step's folder."""
    import tritonclient.grpc as grpcclient
    try:
        server = kitlib.start_server(root, ["--device", kitlib.device()], name="server_after_failed_compile",
                                     timeout=30)
    except Exception as error:  # noqa: BLE001 - reported, whatever it was
        return f"the server did not serve it either: {str(error)[:400]}"
    try:
        client = grpcclient.InferenceServerClient(url=server.url)
        tensor = grpcclient.InferInput("INPUT__0", [1, 784], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 784), dtype=np.float32))
        try:
            client.infer("mlp_aoti", [tensor], client_timeout=20)
            answer = "the server loaded it and answered a request"
        except Exception as error:  # noqa: BLE001
            answer = f"the server loaded it but the request failed: {str(error)[:300]}"
        client.close()
    finally:
        code = server.stop()
    return answer + (f"; the server then exited {code}" if code != 0 else "")


def body():
    import tritonclient.grpc as grpcclient
    root = os.path.join(kitlib.WORK, "aoti_package")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.join(root, "mlp_aoti", "1"))
    gpu = not kitlib.NO_GPU
    with open(os.path.join(root, "mlp_aoti", "config.pbtxt"), "w") as f:
        f.write(CONFIG % ("KIND_GPU" if gpu else "KIND_CPU"))
    package = os.path.join(root, "mlp_aoti", "1", "model.cuda.pt2" if gpu else "model.cpu.pt2")
    started = time.monotonic()
    if gpu:
        missing = missing_compile_tools()
        if missing:
            return "skipped", "skipped: " + "; ".join(missing), {"missing": missing}, ""
        code, text = kitlib.run_logged(
            [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import bundled_models; "
             "bundled_models.export('mlp_aoti', sys.argv[2], device='cuda')",
             os.path.join(kitlib.KIT, "src", "models"), package], "compile.log", timeout=COMPILE_CAP)
        if code != 0:
            outcome = f"the compile exited {code}: {text[-300:]}"
            if os.path.exists(package):  # compiled, then refused by the recipe's probe: does the server load it?
                outcome += " | " + serve_anyway(root)
            return "fail", outcome, {"compile_exit": code}, "```\n" + text[-3000:] + "\n```"
    else:  # the dry run reuses the cached CPU package when there is one
        shutil.copyfile(generate_models.cached_package("mlp_aoti"), package)
    compile_s = time.monotonic() - started

    device = kitlib.torch_device()
    reference = torch._inductor.aoti_load_package(package)
    server = kitlib.start_server(root, ["--device", kitlib.device()])
    failures = []
    try:
        log = server.log()
        load_ms = re.search(r"event=model_ready model=mlp_aoti version=1 .*?load_ms=(\d+)", log)
        client = grpcclient.InferenceServerClient(url=server.url)
        rng = np.random.default_rng(5)
        jobs = [rng.random((1 + i % 3, 784), dtype=np.float32) for i in range(24)]
        answers = queue.Queue()
        for index, data in enumerate(jobs):
            tensor = grpcclient.InferInput("INPUT__0", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data)
            client.async_infer("mlp_aoti", [tensor], lambda result, error, index=index: answers.put((index, result, error)))
        for _ in jobs:
            index, result, error = answers.get(timeout=60)
            if error is not None:
                failures.append(f"request {index}: {error}")
                continue
            with torch.no_grad():
                want = reference(torch.from_numpy(jobs[index]).to(device)).cpu().numpy()
            got = result.as_numpy("OUTPUT__0")
            rtol, atol = kitlib.TOLERANCE["FP32"]
            if got.shape != want.shape or not np.allclose(got, want, rtol=rtol, atol=atol):
                failures.append(f"request {index}: differs from the package run in Python")
        stats = kitlib.model_statistics(server.url, "mlp_aoti")
        client.close()
    finally:
        server.stop()
    numbers = {"compile_s": round(compile_s, 1), "load_ms": int(load_ms.group(1)) if load_ms else None,
               "requests": len(jobs), "executions": stats.get("executions")}
    summary = (f"{len(jobs) - len(failures)}/{len(jobs)} answers equal the package's Python outputs; "
               f"compiled in {compile_s:.0f} s, loaded in {numbers['load_ms']} ms")
    details = "\n".join(failures[:20])
    return kitlib.gpu_outcome(not failures and load_ms is not None, summary, numbers, details)


kitlib.run_step(body)
