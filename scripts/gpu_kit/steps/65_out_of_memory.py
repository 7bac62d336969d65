"""Out of memory on the GPU: a model that allocates the number of bytes it is given is asked for
200 GiB (more than the card has; a big batch could not get there through a 2 GiB message). The
answer must be RESOURCE_EXHAUSTED with torch's message, and the server must keep serving: the same
model with a small size, another model, and liveness."""
# kit-timeout: 40
import os
import shutil

import numpy as np
import torch

import kitlib


class Allocate(torch.nn.Module):
    def forward(self, NBYTES: torch.Tensor) -> torch.Tensor:
        buffer = torch.empty([int(NBYTES[0])], dtype=torch.uint8, device=NBYTES.device)
        return NBYTES + buffer.numel() * 0


CONFIG = """max_batch_size: 0
input [ { name: "NBYTES" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { kind: KIND_GPU count: 1 } ]
"""


def body():
    import tritonclient.grpc as grpcclient
    from repository_helpers import write
    from tritonclient.utils import InferenceServerException
    root = os.path.join(kitlib.WORK, "out_of_memory")
    shutil.rmtree(root, ignore_errors=True)
    write(root, "allocate", CONFIG, torch.jit.script(Allocate()))
    write(root, "allocate_too", CONFIG, torch.jit.script(Allocate()))
    # On the CPU 200 GiB could succeed lazily (overcommit): the dry run asks for 2^62 bytes,
    # which no allocator grants.
    too_much = 2**62 if kitlib.NO_GPU else 200 * 2**30
    server = kitlib.start_server(root, ["--device", kitlib.device()])
    outcomes, failures = {}, []
    try:
        client = grpcclient.InferenceServerClient(url=server.url)

        def ask(model, nbytes):
            tensor = grpcclient.InferInput("NBYTES", [1], "INT64")
            tensor.set_data_from_numpy(np.array([nbytes], dtype=np.int64))
            try:
                value = int(client.infer(model, [tensor]).as_numpy("OUTPUT__0")[0])
                return "OK", str(value)
            except InferenceServerException as error:
                return str(error.status()).replace("StatusCode.", ""), error.message()

        outcomes["huge"] = ask("allocate", too_much)
        outcomes["small_after"] = ask("allocate", 2**20)
        outcomes["other_model"] = ask("allocate_too", 2**20)
        outcomes["huge_again"] = ask("allocate", too_much)
        outcomes["small_again"] = ask("allocate", 2**20)
        outcomes["live"] = ("OK", str(client.is_server_live()))
        client.close()
    finally:
        code = server.stop()
    want_error = "RESOURCE_EXHAUSTED"
    for key in ("huge", "huge_again"):
        if outcomes.get(key, ("",))[0] != want_error:
            failures.append(f"{key}: {outcomes.get(key)} instead of {want_error}")
    for key in ("small_after", "other_model", "small_again"):
        if outcomes.get(key) != ("OK", str(2**20)):
            failures.append(f"{key}: {outcomes.get(key)}")
    if outcomes.get("live") != ("OK", "True"):
        failures.append(f"not live afterwards: {outcomes.get('live')}")
    if code != 0:
        failures.append(f"the server exited {code}")
    numbers = {key: {"code": value[0], "message": value[1][:300]} for key, value in outcomes.items()}
    details = kitlib.table(["request", "code", "message"],
                           [[k, v[0], v[1][:160].replace("\n", " ")] for k, v in outcomes.items()])
    if failures:
        return kitlib.gpu_outcome(False, "; ".join(failures)[:400], numbers, details)
    return kitlib.gpu_outcome(True, f"{'2^62 bytes on the CPU' if kitlib.NO_GPU else '200 GiB'} answered {want_error}, then "
                              "the model, another model and liveness kept serving", numbers, details)


if __name__ == "__main__":
    kitlib.run_step(body)
