#!/usr/bin/env python3
"""The export recipe for Sluice's torch_aoti platform: torch.export, then an AOTInductor package
(.pt2) whose metadata tells the server what the 2.11 loader cannot (input and output dtypes and
shapes, the batch range, the torch version), so that a config that does not match the package is
refused at load with a message naming the mismatch (server/runtime/aoti_package.h).

    from sluice_export import export_package
    batch = torch.export.Dim("batch", min=1, max=64)
    export_package(model.eval(), (torch.randn(2, 784),), "models/mlp_aoti/1/model.cpu.pt2",
                   dynamic_shapes=({0: batch},))

Example inputs need a batch of 2 or more: torch.export specialises a dimension of size 1 to 1.

With `digests=` the package's SHA-256 goes into that manifest (sluice-server --model-digests, see
docs/guide/security.md), so that the server loads only these bytes; `pin` adds any other file
(an operator library, a TorchScript file) the same way.

config_text writes the config.pbtxt that serves a module in either format from example inputs:

    from sluice_export import config_text
    open("models/mlp/config.pbtxt", "w").write(config_text(model.eval(), (torch.randn(2, 784),)))
"""
import hashlib
import json
import os
import signal
import subprocess
import sys
from typing import Any, Dict, Optional, Sequence

import torch

# torch dtype -> the protocol's datatype name (config.pbtxt's TYPE_ without the prefix).
DTYPES = {
    torch.bool: "BOOL", torch.uint8: "UINT8", torch.int8: "INT8", torch.int16: "INT16",
    torch.int32: "INT32", torch.int64: "INT64", torch.float16: "FP16", torch.bfloat16: "BF16",
    torch.float32: "FP32", torch.float64: "FP64",
}


def _dim(size, ranges) -> Any:
    """A size, [min, max] for a dynamic dimension (max None: unbounded), or None."""
    if isinstance(size, int):
        return size
    expr = size.node.expr
    if expr.is_number:
        return int(expr)
    bounds = ranges.get(expr)
    if bounds is None:
        return None
    upper = bounds.upper
    return [int(bounds.lower), int(upper) if upper.is_finite else None]


def _tensor(name: str, value, ranges) -> Dict[str, Any]:
    if value.dtype not in DTYPES:
        raise ValueError(f"{name}: dtype {value.dtype} has no protocol datatype")
    return {"name": name, "dtype": DTYPES[value.dtype], "shape": [_dim(s, ranges) for s in value.shape]}


def describe(program: torch.export.ExportedProgram, batched: bool = True) -> Dict[str, str]:
    """The sluice.* metadata of an exported program. `batched`: dimension 0 of every input and
    output is the batch (config.pbtxt's max_batch_size > 0)."""
    nodes = {node.name: node for node in program.graph.nodes}
    signature = program.graph_signature
    ranges = program.range_constraints
    inputs = [_tensor(name, nodes[name].meta["val"], ranges) for name in signature.user_inputs]
    outputs = [_tensor(name, nodes[name].meta["val"], ranges) for name in signature.user_outputs]
    batch = None
    if batched:
        first = inputs[0]["shape"][0]
        batch = first if isinstance(first, list) else [first, first]
    return {
        "sluice.format": "1",
        "sluice.torch_version": torch.__version__,
        "sluice.batch": json.dumps(batch),
        "sluice.inputs": json.dumps(inputs),
        "sluice.outputs": json.dumps(outputs),
    }


def accepted_batches(path: str, example_inputs: Sequence[torch.Tensor], low: int, high: int):
    """The batch sizes in [low, high] the compiled package at `path` accepts with its input check
    on (AOTI_RUNTIME_CHECK_INPUTS=1, as the server runs it), as [min, max], or None when none
    does. Inductor may compile a narrower range than the export declared (in 2.11 the bundled
    conv net exported with a batch of 1..32 accepts 2..15), so the recipe asks the package.

    The package is loaded and run in a fresh process, as the server loads it: a package whose
    loading crashes (on 2026-12-04 a CUDA package compiled on an H200 killed the compiling
    process with SIGSEGV in AOTIModelPackageLoader's constructor) raises RuntimeError naming the
    signal, instead of taking the caller down, and says that the server would crash the same way."""
    request = {"path": os.path.abspath(path), "low": low, "high": high,
               "inputs": [{"shape": list(x.shape[1:]), "dtype": str(x.dtype).replace("torch.", ""),
                           "device": str(x.device)} for x in example_inputs]}
    env = dict(os.environ, AOTI_RUNTIME_CHECK_INPUTS="1", PYTHONFAULTHANDLER="1")
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--probe", json.dumps(request)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines or not lines[-1].startswith(_PROBE_ANSWER):
        tail = "\n".join(lines[-25:])
        if done.returncode < 0:
            name = signal.Signals(-done.returncode).name
            raise RuntimeError(f"{path}: loading the compiled package killed a fresh process with {name}; the "
                               f"server would crash the same way loading it. The process's last lines:\n{tail}")
        raise RuntimeError(f"{path}: probing the compiled package's batch sizes failed (exit "
                           f"{done.returncode}):\n{tail}")
    return json.loads(lines[-1][len(_PROBE_ANSWER):])


_PROBE_ANSWER = "sluice-probe-answer: "


def _probe(request: Dict[str, Any]):
    """accepted_batches' child: loads the package, finds the accepted range, returns it or None."""
    runner = torch._inductor.aoti_load_package(request["path"])
    specs = request["inputs"]

    def runs(batch):
        inputs = [torch.zeros((batch, *spec["shape"]), dtype=getattr(torch, spec["dtype"]), device=spec["device"])
                  for spec in specs]
        try:
            with torch.no_grad():
                runner(*inputs)
            return True
        except Exception:  # noqa: BLE001 - the check refused this batch size
            return False

    low, high = request["low"], request["high"]
    smallest = next((b for b in range(low, min(high, low + 2) + 1) if runs(b)), None)
    if smallest is None:
        return None
    lo, hi = smallest, high  # the largest that runs, assuming the accepted sizes are contiguous
    if not runs(hi):
        good, bad = lo, hi
        while bad - good > 1:
            middle = (good + bad) // 2
            good, bad = (middle, bad) if runs(middle) else (good, middle)
        hi = good
    return [lo, hi]


def pin(path: str, manifest: str, repository: Optional[str] = None) -> str:
    """Writes the SHA-256 line of `path` into `manifest` (sha256sum's format, what sluice-server's
    --model-digests reads), replacing the line it had. The path in the line is relative to
    `repository`, by default the directory three levels above a <repository>/<model>/<version>/
    <file> path. Returns the line."""
    root = repository or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(path))))
    relative = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    line = f"{digest.hexdigest()}  {relative}"
    kept = []
    if os.path.exists(manifest):
        with open(manifest) as f:
            kept = [each.rstrip("\n") for each in f if not each.rstrip("\n").endswith(f"  {relative}")]
    with open(manifest, "w") as f:
        f.write("".join(each + "\n" for each in kept + [line]))
    return line


def export_package(module: torch.nn.Module, example_inputs: Sequence[torch.Tensor], path: str, *,
                   dynamic_shapes: Optional[Sequence[Any]] = None, batched: bool = True,
                   inductor_configs: Optional[Dict[str, Any]] = None,
                   digests: Optional[str] = None) -> str:
    """Exports `module` (in eval mode) and compiles it into an AOTInductor package at `path`, for
    the device the example inputs are on. With a dynamic batch, the package is then asked which
    batch sizes it accepts; when that is narrower than the export declared, it is compiled again
    with metadata that says so (the server then refuses a max_batch_size above it at load, rather
    than failing warm-up). With `digests`, the package is pinned in that manifest (`pin`).
    Returns the path."""
    path = _export_package(module, example_inputs, path, dynamic_shapes=dynamic_shapes, batched=batched,
                           inductor_configs=inductor_configs)
    if digests:
        pin(path, digests)
    return path


def _export_package(module, example_inputs, path, *, dynamic_shapes, batched, inductor_configs) -> str:
    with torch.no_grad():
        program = torch.export.export(module, tuple(example_inputs), dynamic_shapes=dynamic_shapes)
    metadata = describe(program, batched)
    configs = {
        "aot_inductor.metadata": metadata,
        # CPU kernels take their thread count from the calling thread (at::set_num_threads), so the
        # server's division of the cores among instances applies.
        "cpp.dynamic_threads": True,
    }
    configs.update(inductor_configs or {})
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    path = torch._inductor.aoti_compile_and_package(program, package_path=path, inductor_configs=configs)
    declared = json.loads(metadata["sluice.batch"])
    if declared is None or declared[0] == declared[1] or declared[1] is None:
        return path
    accepted = accepted_batches(path, example_inputs, max(declared[0], 2), declared[1])
    if accepted is None:
        raise RuntimeError(f"{path}: the compiled package accepts no batch size in {declared}")
    if accepted[1] != declared[1]:
        print(f"{path}: the compiled package accepts batches {accepted[0]}..{accepted[1]}, not "
              f"{declared[0]}..{declared[1]}; compiling it again with metadata that says so", flush=True)
        metadata["sluice.batch"] = json.dumps(accepted)
        for key in ("sluice.inputs", "sluice.outputs"):
            tensors = json.loads(metadata[key])
            for tensor in tensors:
                if tensor["shape"] and isinstance(tensor["shape"][0], list):
                    tensor["shape"][0] = accepted
            metadata[key] = json.dumps(tensors)
        path = torch._inductor.aoti_compile_and_package(program, package_path=path, inductor_configs=configs)
    return path


def config_text(module: torch.nn.Module, example_inputs: Sequence[torch.Tensor], *,
                platform: str = "pytorch_libtorch", max_batch_size: int = 8,
                dynamic: Optional[Dict[int, Sequence[int]]] = None,
                input_names: Optional[Sequence[str]] = None) -> str:
    """The config.pbtxt that serves `module` as it answers `example_inputs`, for either format
    (a TorchScript file cannot tell its tensors; a .pt2 exported with export_package can, but
    writing the file shows what the server will serve). The module runs once on the examples: each
    input and output gets its datatype and its dims after the batch dimension (dimension 0 when
    max_batch_size > 0; 0: no batch dimension); `dynamic` maps an input's index to the dims (counted
    after the batch) that vary, written -1, and an output dimension that follows one of them by
    size is -1 too. Inputs are INPUT__<i> (or `input_names`, forward's argument names); outputs
    OUTPUT__<i>, or a returned dict's keys. A tuple, list or dict of tensors is read flat. Give a
    varying dimension an example size no fixed dimension has, so that outputs follow it by size."""
    batched = max_batch_size > 0
    with torch.no_grad():
        result = module(*example_inputs)
    if isinstance(result, dict):
        outputs = list(result.items())
    elif isinstance(result, (tuple, list)):
        outputs = [(f"OUTPUT__{i}", value) for i, value in enumerate(result)]
    else:
        outputs = [("OUTPUT__0", result)]
    varying = set()
    for index, dims in (dynamic or {}).items():
        shape = example_inputs[index].shape[1 if batched else 0:]
        varying.update(int(shape[d]) for d in dims)

    def block(kind, name, value, variable):
        if value.dtype not in DTYPES:
            raise ValueError(f"{name}: dtype {value.dtype} has no protocol datatype")
        dims = list(value.shape[1 if batched else 0:])
        shown = ["-1" if variable(d, size) else str(size) for d, size in enumerate(dims)]
        return (f'  {{ name: "{name}" data_type: TYPE_{DTYPES[value.dtype]} '
                f'dims: [ {", ".join(shown)} ] }}')

    names = list(input_names) if input_names else [f"INPUT__{i}" for i in range(len(example_inputs))]
    inputs = [block("input", names[i], value, lambda d, size, i=i: d in (dynamic or {}).get(i, ()))
              for i, value in enumerate(example_inputs)]
    outs = [block("output", name, value, lambda d, size: size in varying) for name, value in outputs]
    text = f'platform: "{platform}"\nmax_batch_size: {max_batch_size}\n'
    text += "input [\n" + ",\n".join(inputs) + "\n]\n"
    text += "output [\n" + ",\n".join(outs) + "\n]\n"
    if batched:
        text += "dynamic_batching { }\n"
    return text


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--probe":
    print(_PROBE_ANSWER + json.dumps(_probe(json.loads(sys.argv[2]))), flush=True)
