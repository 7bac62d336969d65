"""10 load/unload cycles of a model with 256 MiB of weights on the GPU, in explicit model-control
mode: each unload must give the model's memory back (the device's used memory after each unload
within 5% of the model's size of what it was after the first), and every request answers.
The server's RSS after each unload is recorded too (pinned host memory is given back on unload).
The model has CUDA graphs on (each load captures its batch sizes at warm-up), so the graphs'
private memory pool must go with each unload too; the log's capture lines are counted."""
# kit-timeout: 60
import os
import re
import shutil

import numpy as np
import torch

import kitlib

CYCLES = 10
CONFIG = """max_batch_size: 8
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {n} ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {n} ] }} ]
instance_group [ {{ kind: KIND_GPU count: 1 }} ]
optimization {{ cuda {{ graphs: true }} }}
"""


class Big(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n, n) * 0.01, requires_grad=False)

    def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:
        return INPUT__0 @ self.weight


def rss_mib(server):
    """The server's resident memory: unload must give back pinned host memory too."""
    from harness.process import rss_bytes
    return rss_bytes(server.process.pid) / 2**20


def used_mib(server):
    """Device memory in use (all processes) on a GPU; the server's RSS in the CPU dry run."""
    if kitlib.NO_GPU:
        return rss_mib(server)
    free, total = torch.cuda.mem_get_info(0)
    return (total - free) / 2**20


def body():
    import tritonclient.grpc as grpcclient
    from repository_helpers import write
    n = 1024 if kitlib.NO_GPU else 8192  # 4 MiB for the dry run, 256 MiB on a GPU
    cycles = 3 if kitlib.NO_GPU else CYCLES
    model_mib = n * n * 4 / 2**20
    root = os.path.join(kitlib.WORK, "memory_cycles")
    shutil.rmtree(root, ignore_errors=True)
    torch.manual_seed(0)
    write(root, "big", CONFIG.format(n=n), torch.jit.script(Big(n)))
    if not kitlib.NO_GPU:
        torch.cuda.init()  # this process's own context first, so that it is in every figure
        torch.cuda.mem_get_info(0)
    server = kitlib.start_server(root, ["--device", kitlib.device(), "--model-control-mode", "explicit"])
    rows, failures = [], []
    try:
        client = grpcclient.InferenceServerClient(url=server.url)
        baseline = used_mib(server)
        data = np.ones((1, n), dtype=np.float32)
        for cycle in range(1, cycles + 1):
            client.load_model("big")
            tensor = grpcclient.InferInput("INPUT__0", [1, n], "FP32")
            tensor.set_data_from_numpy(data)
            out = client.infer("big", [tensor]).as_numpy("OUTPUT__0")
            if out.shape != (1, n):
                failures.append(f"cycle {cycle}: output shape {out.shape}")
            loaded = used_mib(server)
            client.unload_model("big")
            unloaded = used_mib(server)
            rows.append([cycle, round(loaded, 1), round(unloaded, 1), round(loaded - unloaded, 1),
                         round(rss_mib(server), 1)])
        client.close()
    finally:
        code = server.stop()
    if code != 0:
        failures.append(f"the server exited {code}")
    log = open(server.log_path).read()
    captures = len(re.findall(r"event=cuda_graph_captured model=big ", log))
    unit = "RSS MiB" if kitlib.NO_GPU else "device MiB used"
    numbers = {"model_mib": model_mib, "cycles": len(rows), "baseline_mib": round(baseline, 1),
               "loaded_mib": [r[1] for r in rows], "after_unload_mib": [r[2] for r in rows], "measure": unit,
               "rss_after_unload_mib": [r[4] for r in rows], "graph_captures": captures}
    details = (f"Before the first load: {baseline:.1f} {unit}.\n\n"
               + kitlib.table(["cycle", f"loaded ({unit})", f"after unload ({unit})", "given back",
                               "server RSS after unload (MiB)"], rows))
    if len(rows) < cycles:
        failures.append(f"only {len(rows)} of {cycles} cycles ran")
    if rows and not kitlib.NO_GPU:
        if captures < len(rows):
            failures.append(f"{captures} CUDA graph captures in {len(rows)} loads (a load captures its shapes)")
        growth = rows[-1][2] - rows[0][2]
        numbers["growth_after_first_unload_mib"] = round(growth, 1)
        if growth > 0.05 * model_mib:
            failures.append(f"used memory after unload grew {growth:.1f} MiB over {cycles} cycles "
                            f"(limit {0.05 * model_mib:.1f} MiB, 5% of the model)")
        short = [r[0] for r in rows if r[3] < 0.95 * model_mib]
        if short:
            failures.append(f"cycles {short} gave back less than 95% of the model's {model_mib:.0f} MiB")
    if failures:
        return kitlib.gpu_outcome(False, "; ".join(failures)[:400], numbers, details)
    return kitlib.gpu_outcome(True, f"{len(rows)} cycles of a {model_mib:.0f} MiB model with CUDA graphs "
                              f"({captures} captures); after unload {rows[0][2]:.0f} -> {rows[-1][2]:.0f} {unit}",
                              numbers, details)


if __name__ == "__main__":
    kitlib.run_step(body)
