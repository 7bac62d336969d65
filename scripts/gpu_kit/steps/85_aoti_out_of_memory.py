"""Out of memory inside an AOTInductor package: AOTInductor's runner rewraps every error as
"run_func_(...) API call failed", so the message cannot tell; the server reads the caching
allocator's out-of-memory counter around the forward pass instead. A package whose output has as
many bytes as its input asks for (compiled here for the step's device, in its own process under
COMPILE_CAP) is asked for 200 GiB: the answer must be RESOURCE_EXHAUSTED, then the same model with
a small size, and liveness, keep serving. Needs what 80_aoti_package needs to compile: skipped
when that step was skipped (budget or missing tools).
The CPU dry run asks for 2^62 bytes: the CPU allocator keeps no counter, so there the answer is
INTERNAL (the runner swallowed the allocator's message), which the dry run expects; the server must
still serve and stay live."""
# kit-timeout: 120
import json
import os
import shutil
import sys

import numpy as np
import torch

import kitlib

COMPILE_CAP = 100  # seconds: about 25 s on two busy cores for the CPU dry run; an H200 machine took over 35 s
CONFIG = """platform: "torch_aoti"
max_batch_size: 0
input [ { name: "NBYTES" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_UINT8 dims: [ -1 ] } ]
instance_group [ { kind: %s count: 1 } ]
"""


class Allocate(torch.nn.Module):
    """Returns NBYTES[0] zero bytes: the output buffer is allocated inside the package."""

    def forward(self, NBYTES: torch.Tensor) -> torch.Tensor:
        n = NBYTES[0].item()
        torch._check(n >= 0)
        torch._check(n <= 2**62)
        return torch.zeros(n, dtype=torch.uint8, device=NBYTES.device)


def compile_package(path, device):
    sys.path.insert(0, os.path.join(kitlib.KIT, "src", "models"))
    from sluice_export import export_package
    export_package(Allocate().eval(), (torch.tensor([1024], dtype=torch.int64, device=device),), path, batched=False)


def body():
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException
    try:
        with open(os.path.join(kitlib.WORK, "steps", "80_aoti_package", "result.json")) as f:
            before = json.load(f)
    except (OSError, ValueError):
        before = {"status": "skipped", "summary": "80_aoti_package did not run"}
    if before.get("status") == "skipped" and not kitlib.NO_GPU:
        return "skipped", f"skipped: 80_aoti_package could not compile ({before.get('summary', '')[:200]})", {}, ""
    gpu = not kitlib.NO_GPU
    root = os.path.join(kitlib.WORK, "aoti_out_of_memory")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.join(root, "allocate", "1"))
    with open(os.path.join(root, "allocate", "config.pbtxt"), "w") as f:
        f.write(CONFIG % ("KIND_GPU" if gpu else "KIND_CPU"))
    package = os.path.join(root, "allocate", "1", "model.cuda.pt2" if gpu else "model.cpu.pt2")
    code, text = kitlib.run_logged([sys.executable, os.path.abspath(__file__), "compile", package, kitlib.torch_device()],
                                   "compile.log", timeout=COMPILE_CAP)
    if code != 0:
        return kitlib.gpu_outcome(False, f"the compile exited {code}: {text[-300:]}", {}, "```\n" + text[-3000:] + "\n```")
    too_much = 2**62 if kitlib.NO_GPU else 200 * 2**30
    server = kitlib.start_server(root, ["--device", kitlib.device()], timeout=30)
    outcomes = {}
    try:
        client = grpcclient.InferenceServerClient(url=server.url)

        def ask(nbytes):
            tensor = grpcclient.InferInput("NBYTES", [1], "INT64")
            tensor.set_data_from_numpy(np.array([nbytes], dtype=np.int64))
            try:
                return "OK", str(client.infer("allocate", [tensor], client_timeout=20).as_numpy("OUTPUT__0").size)
            except InferenceServerException as error:
                return str(error.status()).replace("StatusCode.", ""), error.message()

        outcomes["small"] = ask(2**20)
        outcomes["huge"] = ask(too_much)
        outcomes["small_after"] = ask(2**20)
        outcomes["live"] = ("OK", str(client.is_server_live()))
        client.close()
    finally:
        exit_code = server.stop()
    want = "INTERNAL" if kitlib.NO_GPU else "RESOURCE_EXHAUSTED"
    failures = []
    if outcomes.get("huge", ("",))[0] != want:
        failures.append(f"huge: {outcomes.get('huge')} instead of {want}")
    for key in ("small", "small_after"):
        if outcomes.get(key) != ("OK", str(2**20)):
            failures.append(f"{key}: {outcomes.get(key)}")
    if outcomes.get("live") != ("OK", "True"):
        failures.append(f"not live afterwards: {outcomes.get('live')}")
    if exit_code != 0:
        failures.append(f"the server exited {exit_code}")
    numbers = {key: {"code": value[0], "message": value[1][:300]} for key, value in outcomes.items()}
    details = kitlib.table(["request", "code", "message"],
                           [[k, v[0], v[1][:160].replace("\n", " ")] for k, v in outcomes.items()])
    if failures:
        return kitlib.gpu_outcome(False, "; ".join(failures)[:400], numbers, details)
    return kitlib.gpu_outcome(True, f"a .pt2 asked for {'2^62 bytes on the CPU' if kitlib.NO_GPU else '200 GiB'} "
                              f"answered {want}; the model and liveness kept serving", numbers, details)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "compile":
        compile_package(sys.argv[2], sys.argv[3])
    else:
        kitlib.run_step(body)
