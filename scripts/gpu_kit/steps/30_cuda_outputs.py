"""Outputs on the GPU against torch: the bundled MLP and conv net and one model per datatype,
served with dynamic batching on --device cuda, each answer (sent concurrently so that requests
batch, with 1 or 2 rows each) compared with the same TorchScript module run by torch on the same
GPU: byte-equal for integers and BOOL, within the per-datatype tolerance for floats."""
# kit-timeout: 60
import os
import queue
import shutil

import numpy as np
import torch

import kitlib

# What a datatype's model computes (DtypeModel.forward).
MATMUL, HALVE, TRIPLE_MINUS_ONE, TRIPLE_PLUS_ONE, NOT = range(5)
# datatype: (numpy dtype, torch dtype, what its model computes)
DTYPES = {
    "FP32": (np.float32, torch.float32, MATMUL),
    "FP16": (np.float16, torch.float16, MATMUL),
    "BF16": (None, torch.bfloat16, MATMUL),
    "FP64": (np.float64, torch.float64, HALVE),
    "INT64": (np.int64, torch.int64, TRIPLE_MINUS_ONE),
    "INT32": (np.int32, torch.int32, TRIPLE_MINUS_ONE),
    "INT16": (np.int16, torch.int16, TRIPLE_MINUS_ONE),
    "INT8": (np.int8, torch.int8, TRIPLE_MINUS_ONE),
    "UINT8": (np.uint8, torch.uint8, TRIPLE_PLUS_ONE),
    "BOOL": (np.bool_, torch.bool, NOT),
}
ROWS = 16
CONFIG = """max_batch_size: 8
input [ {{ name: "INPUT__0" data_type: TYPE_{dt} dims: [ {rows} ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_{dt} dims: [ {rows} ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
instance_group [ {{ kind: KIND_GPU count: 1 }} ]
"""


class DtypeModel(torch.nn.Module):
    """One elementwise or matrix operation per datatype (DTYPES), on a fixed random weight."""

    def __init__(self, kind, torch_dtype):
        super().__init__()
        self.kind = kind
        w = torch.randn(ROWS, ROWS, generator=torch.Generator().manual_seed(3)) * 0.1
        self.register_buffer("w", w.to(torch_dtype) if torch_dtype.is_floating_point else w)

    def forward(self, x):
        if self.kind == 0:  # MATMUL
            return x @ self.w + 1.0
        if self.kind == 1:  # HALVE
            return x * 0.5 + 1.0
        if self.kind == 2:  # TRIPLE_MINUS_ONE
            return x * 3 - 1
        if self.kind == 3:  # TRIPLE_PLUS_ONE
            return x * 3 + 1
        return torch.logical_not(x)


def dtype_module(datatype):
    return torch.jit.script(DtypeModel(DTYPES[datatype][2], DTYPES[datatype][1]))


def random_rows(datatype, rows, rng):
    np_dtype = DTYPES[datatype][0]
    if datatype == "BOOL":
        return rng.random((rows, ROWS)) < 0.5
    if datatype == "BF16":
        import ml_dtypes
        return (rng.standard_normal((rows, ROWS))).astype(ml_dtypes.bfloat16)
    if np.issubdtype(np_dtype, np.integer):
        info = np.iinfo(np_dtype)
        low, high = max(info.min, -20), min(info.max, 40)
        return rng.integers(low, high, size=(rows, ROWS)).astype(np_dtype)
    return rng.standard_normal((rows, ROWS)).astype(np_dtype)


def to_torch(array, datatype):
    if datatype == "BF16":
        return torch.from_numpy(array.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(array))


def compare(datatype, got, want):
    """None when equal within the datatype's tolerance, else what differs."""
    if datatype == "BF16":
        got, want = np.asarray(got, dtype=np.float32), want.float().numpy()
    else:
        want = want.numpy()
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    if datatype in kitlib.TOLERANCE:
        rtol, atol = kitlib.TOLERANCE[datatype]
        if not np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol):
            return f"max abs difference {np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))):.3g}"
        return None
    return None if got.tobytes() == want.tobytes() else "bytes differ"


def body():
    import tritonclient.grpc as grpcclient
    root = os.path.join(kitlib.WORK, "cuda_outputs")
    shutil.rmtree(root, ignore_errors=True)
    datatypes = list(DTYPES)
    try:
        import ml_dtypes  # noqa: F401 - tritonclient needs it for BF16
    except ImportError:
        datatypes.remove("BF16")
    modules = {}
    for datatype in datatypes:
        name = f"dtype_{datatype.lower()}"
        modules[name] = (datatype, dtype_module(datatype))
        os.makedirs(os.path.join(root, name, "1"))
        with open(os.path.join(root, name, "config.pbtxt"), "w") as f:
            f.write(CONFIG.format(dt=datatype, rows=ROWS))
        modules[name][1].save(os.path.join(root, name, "1", "model.pt"))
    kitlib.write_bundled(root, ["mlp", "convnet"], "dynamic_batching { max_queue_delay_microseconds: 2000 }")
    bundled = {"mlp": ("INPUT__0", "OUTPUT__0", [784]), "convnet": ("image", "logits", [3, 32, 32])}

    device = kitlib.torch_device()
    server = kitlib.start_server(root, ["--device", kitlib.device()])
    rows, failures = [], []
    try:
        client = grpcclient.InferenceServerClient(url=server.url)
        rng = np.random.default_rng(11)
        jobs = []
        for name, (datatype, _) in modules.items():
            for i in range(8):
                jobs.append((name, datatype, "INPUT__0", "OUTPUT__0", random_rows(datatype, 1 + i % 2, rng)))
        for name, (input_name, output_name, shape) in bundled.items():
            for i in range(8):
                jobs.append((name, "FP32", input_name, output_name,
                             rng.random((1 + i % 2, *shape), dtype=np.float32)))
        answers = queue.Queue()
        for index, (name, datatype, input_name, output_name, data) in enumerate(jobs):
            tensor = grpcclient.InferInput(input_name, list(data.shape), datatype)
            tensor.set_data_from_numpy(data)
            client.async_infer(name, [tensor], lambda result, error, index=index: answers.put((index, result, error)),
                               outputs=[grpcclient.InferRequestedOutput(output_name)])
        results = {}
        for _ in jobs:
            index, result, error = answers.get(timeout=60)
            results[index] = (result, error)
        references = {name: torch.jit.load(os.path.join(root, name, "1", "model.pt"), map_location=device)
                      for name in list(modules) + list(bundled)}
        checked = {}
        for index, (name, datatype, _, output_name, data) in enumerate(jobs):
            result, error = results[index]
            if error is not None:
                failures.append(f"{name}: {error}")
                continue
            with torch.inference_mode():
                want = references[name](to_torch(data, datatype).to(device)).cpu()
            problem = compare(datatype, result.as_numpy(output_name), want)
            if problem:
                failures.append(f"{name} request {index}: {problem}")
            checked[name] = checked.get(name, 0) + 1
        stats = {name: kitlib.model_statistics(server.url, name) for name in checked}
        client.close()
        for name, count in sorted(checked.items()):
            s = stats[name]
            rows.append([name, modules.get(name, ("FP32",))[0], count, s["inferences"], s["executions"]])
    finally:
        code = server.stop()
    if code != 0:
        failures.append(f"the server exited {code}")
    log = open(server.log_path).read()
    placed = log.count(f"device={'cuda:0' if not kitlib.NO_GPU else 'cpu'}")
    numbers = {"requests": len(jobs), "models": len(rows), "failures": failures[:20],
               "executions": {row[0]: row[4] for row in rows}, "instances_on_device": placed}
    details = kitlib.table(["model", "datatype", "answers checked", "inferences", "executions"], rows)
    if failures:
        return kitlib.gpu_outcome(False, f"{len(failures)} wrong or failed answer(s): {failures[0]}"[:400], numbers,
                                  details)
    batched = sum(1 for row in rows if row[4] < row[3])
    return kitlib.gpu_outcome(True, f"{len(jobs)} answers from {len(rows)} models ({', '.join(datatypes)}) equal torch "
                              f"on {device}; {batched} models batched requests", numbers, details)


if __name__ == "__main__":
    kitlib.run_step(body)
