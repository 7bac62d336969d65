#!/usr/bin/env python3
"""Memory across model load/unload cycles: does unloading a TorchScript model give its memory
back? (Triton's users report about 1 GB lost per 50 cycles with TorchScript models,
triton-inference-server/server#5841.)

    .venv/bin/python benchmarks/model_cycle_benchmark.py [--smoke] [--cycles 50] [--json out.json]

Side by side in one run:
  sluice      sluice-server --model-control-mode explicit; each cycle is RepositoryModelLoad,
              5 inferences, RepositoryModelUnload; the server's RSS is read from /proc after each
              load and each unload.
  libtorch    the same cycle in-process with LibTorch (torch.jit.load, 5 forwards, del, and
              malloc_trim as the server does): what LibTorch itself keeps.
The model holds 32 MiB of weights (a 2048 x 4096 linear layer), so a leaked module shows as
32 MiB per cycle. Reported: RSS after the first and the last unload, growth per cycle after the
first 5 cycles (the allocators settle in the first few), and the high-water mark. On a GPU host
the server's GPU memory is the CUDA caching allocator's, emptied after each unload (see
ReleaseCachedMemory); nvidia-smi's figure for the process is the one to watch there.

Prints a table and writes JSON. --smoke runs 3 cycles of an 8 MiB model; its numbers mean nothing.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from harness.bench import ROOT, serve, write_json  # noqa: E402
from harness.process import rss_bytes  # noqa: E402

SETTLE = 5  # cycles before growth is measured


def make_model(path, rows, columns):
    import torch

    class Linear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(rows, columns) * 0.01, requires_grad=False)

        def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:
            return INPUT__0 @ self.weight

    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.jit.script(Linear()).save(path)


def summarise(unloaded, loaded):
    mib = 2 ** 20
    settled = unloaded[min(SETTLE, len(unloaded) - 1)]
    after = len(unloaded) - 1 - min(SETTLE, len(unloaded) - 1)
    return {
        "cycles": len(unloaded),
        "rss_first_unload_mib": unloaded[0] / mib,
        "rss_last_unload_mib": unloaded[-1] / mib,
        "growth_per_cycle_after_settling_mib": (unloaded[-1] - settled) / mib / after if after else 0.0,
        "growth_after_settling_mib": (unloaded[-1] - settled) / mib,
        "peak_loaded_mib": max(loaded) / mib,
    }


def run_sluice(bin_dir, directory, cycles, rows, columns):
    import tritonclient.grpc as grpcclient
    repository = os.path.join(directory, "repository")
    make_model(os.path.join(repository, "linear", "1", "model.pt"), rows, columns)
    with open(os.path.join(repository, "linear", "config.pbtxt"), "w") as f:
        f.write(f'max_batch_size: 8\n'
                f'input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {rows} ] }} ]\n'
                f'output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {columns} ] }} ]\n'
                f'instance_group [ {{ kind: KIND_CPU count: 1 }} ]\n')
    process, url = serve(bin_dir, repository, ["--model-control-mode", "explicit", "--device", "cpu"])
    client = grpcclient.InferenceServerClient(url)
    data = np.ones((1, rows), dtype=np.float32)
    loaded, unloaded, seconds = [], [], []
    try:
        for _ in range(cycles):
            started = time.monotonic()
            client.load_model("linear")
            for _ in range(5):
                inputs = [grpcclient.InferInput("INPUT__0", [1, rows], "FP32")]
                inputs[0].set_data_from_numpy(data)
                client.infer("linear", inputs)
            loaded.append(rss_bytes(process.pid))
            client.unload_model("linear")
            seconds.append(time.monotonic() - started)
            unloaded.append(rss_bytes(process.pid))
    finally:
        client.close()
        process.terminate()
        process.wait(timeout=60)
    return {**summarise(unloaded, loaded), "cycle_seconds_median": statistics.median(seconds),
            "rss_unloaded_mib": [r / 2 ** 20 for r in unloaded]}


def run_libtorch(directory, cycles, rows, columns):
    """The same cycles in a fresh Python process with LibTorch only."""
    script = f"""
import ctypes, gc, json, re, torch
torch.set_num_threads(1)
def rss():
    return int(re.search(r"VmRSS:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
libc = ctypes.CDLL("libc.so.6")
path = {os.path.join(directory, "repository", "linear", "1", "model.pt")!r}
x = torch.ones(1, {rows})
loaded, unloaded = [], []
for _ in range({cycles}):
    module = torch.jit.load(path)
    module.eval()
    with torch.inference_mode():
        for _ in range(5):
            module(x)
    loaded.append(rss())
    del module
    gc.collect()
    libc.malloc_trim(0)
    unloaded.append(rss())
print(json.dumps({{"loaded": loaded, "unloaded": unloaded}}))
"""
    import json
    result = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    data = json.loads(result.stdout.strip().splitlines()[-1])
    return {**summarise(data["unloaded"], data["loaded"]), "rss_unloaded_mib": [r / 2 ** 20 for r in data["unloaded"]]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    parser.add_argument("--json", default=os.path.join(ROOT, "build", "model_cycle_benchmark.json"))
    args = parser.parse_args()
    cycles = 3 if args.smoke else args.cycles
    rows, columns = (1024, 2048) if args.smoke else (2048, 4096)
    with tempfile.TemporaryDirectory() as directory:
        sluice = run_sluice(args.bin_dir, directory, cycles, rows, columns)
        libtorch = run_libtorch(directory, cycles, rows, columns)
    weights_mib = rows * columns * 4 / 2 ** 20
    print(f"\n{cycles} load/unload cycles of a model with {weights_mib:.0f} MiB of weights (RSS, MiB)")
    print(f"{'':10} {'first unload':>13} {'last unload':>12} {'growth/cycle':>13} {'growth':>8} {'peak':>8}")
    for name, result in (("sluice", sluice), ("libtorch", libtorch)):
        print(f"{name:10} {result['rss_first_unload_mib']:13.1f} {result['rss_last_unload_mib']:12.1f} "
              f"{result['growth_per_cycle_after_settling_mib']:13.2f} {result['growth_after_settling_mib']:8.1f} "
              f"{result['peak_loaded_mib']:8.1f}")
    print(f"(growth after cycle {SETTLE}; a leaked module would add {weights_mib:.0f} MiB per cycle; "
          f"sluice cycle median {sluice['cycle_seconds_median'] * 1000:.0f} ms)")
    write_json(args.json, {"smoke": args.smoke, "cycles": cycles, "weights_mib": weights_mib,
                           "settle_cycles": SETTLE, "sluice": sluice, "libtorch_in_process": libtorch})


if __name__ == "__main__":
    main()
