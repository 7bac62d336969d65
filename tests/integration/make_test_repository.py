#!/usr/bin/env python3
"""Builds the model repository the integration tests serve: one small TorchScript model per
datatype, models for input/output binding (names, tuples, dicts), a model that raises, several
versions, and broken models of every kind the server must survive.

    python make_test_repository.py DIR
"""
import os
import sys
from typing import Dict, Tuple

import torch
from torch import nn

# datatype -> (torch dtype, config TYPE_ name)
DTYPES = {
    "BOOL": (torch.bool, "TYPE_BOOL"),
    "UINT8": (torch.uint8, "TYPE_UINT8"),
    "INT8": (torch.int8, "TYPE_INT8"),
    "INT16": (torch.int16, "TYPE_INT16"),
    "INT32": (torch.int32, "TYPE_INT32"),
    "INT64": (torch.int64, "TYPE_INT64"),
    "FP16": (torch.float16, "TYPE_FP16"),
    "BF16": (torch.bfloat16, "TYPE_BF16"),
    "FP32": (torch.float32, "TYPE_FP32"),
    "FP64": (torch.float64, "TYPE_FP64"),
}


class Double(nn.Module):
    def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:
        return INPUT__0 + INPUT__0


class Invert(nn.Module):
    def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:
        return ~INPUT__0


class MultiIo(nn.Module):
    def forward(self, values: torch.Tensor, counts: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"total": values + counts.to(torch.float32), "twice": counts * 2}


class TupleOut(nn.Module):
    def forward(self, INPUT__0: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return INPUT__0 * 2.0, INPUT__0.sum(dim=1, keepdim=True)


class NoBatch(nn.Module):
    def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:
        return INPUT__0.t().contiguous()


class Throws(nn.Module):
    def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:
        if bool((INPUT__0 < 0).any()):
            raise RuntimeError("negative input is not allowed")
        return INPUT__0 + 1.0


class RowMix(nn.Module):
    """Each row depends on itself only, so batching must not change any answer."""

    def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:
        return INPUT__0 * 2.0 + INPUT__0.sum(dim=1, keepdim=True)


class AddConstant(nn.Module):
    def __init__(self, constant: float):
        super().__init__()
        self.constant = constant

    def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:
        return INPUT__0 + self.constant


class Spin(nn.Module):
    """OUTPUT__0 = INPUT__0 + 1 (or, with `noise`, plus fresh noise in [0, 1): no two runs agree),
    after int(INPUT__0[0, 0]) small matrix products (5-8 us each here): a request that holds its
    instance for as long as its first value says while others queue behind it."""

    def __init__(self, noise: bool = False):
        super().__init__()
        self.noise = noise

    def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:
        steps = int(INPUT__0[0, 0].item())
        w = torch.full([32, 32], 0.01)
        h = torch.ones([1, 32])
        for _ in range(steps):
            h = torch.tanh(h @ w) + 0.5
        offset = torch.rand_like(INPUT__0) if self.noise else torch.ones_like(INPUT__0)
        return INPUT__0 + offset + h.sum() * 0.0


def tensor_block(kind, name, type_name, dims):
    return f'{kind} [{{ name: "{name}" data_type: {type_name} dims: [ {", ".join(map(str, dims))} ] }}]\n'


def write_model(root, name, config, module=None, versions=(1,)):
    directory = os.path.join(root, name)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.pbtxt"), "w") as f:
        f.write(config)
    for version in versions:
        os.makedirs(os.path.join(directory, str(version)), exist_ok=True)
        if module is not None:
            built = module(version) if callable(module) and not isinstance(module, nn.Module) else module
            torch.jit.script(built).save(os.path.join(directory, str(version), "model.pt"))


def main(root):
    os.makedirs(root, exist_ok=True)
    for datatype, (_, type_name) in DTYPES.items():
        module = Invert() if datatype == "BOOL" else Double()
        config = (f'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
                  + tensor_block("input", "INPUT__0", type_name, [-1])
                  + tensor_block("output", "OUTPUT__0", type_name, [-1])
                  + "instance_group [{ kind: KIND_CPU count: 2 }]\n")
        write_model(root, f"dtype_{datatype.lower()}", config, module)

    write_model(root, "multi_io",
                'platform: "pytorch_libtorch"\nmax_batch_size: 4\n'
                'input [{ name: "values" data_type: TYPE_FP32 dims: [ 4 ] },'
                ' { name: "counts" data_type: TYPE_INT64 dims: [ 4 ] }]\n'
                'output [{ name: "total" data_type: TYPE_FP32 dims: [ 4 ] },'
                ' { name: "twice" data_type: TYPE_INT64 dims: [ 4 ] }]\n', MultiIo())
    write_model(root, "tuple_out",
                'platform: "pytorch_libtorch"\nmax_batch_size: 4\n'
                + tensor_block("input", "INPUT__0", "TYPE_FP32", [3])
                + 'output [{ name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 1 ] },'
                  ' { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] }]\n', TupleOut())
    write_model(root, "no_batch",
                'platform: "pytorch_libtorch"\nmax_batch_size: 0\n'
                + tensor_block("input", "INPUT__0", "TYPE_FP32", [2, 3])
                + tensor_block("output", "OUTPUT__0", "TYPE_FP32", [3, 2]), NoBatch())
    write_model(root, "throws",
                'platform: "pytorch_libtorch"\nmax_batch_size: 4\n'
                + tensor_block("input", "INPUT__0", "TYPE_FP32", [2])
                + tensor_block("output", "OUTPUT__0", "TYPE_FP32", [2]), Throws())
    write_model(root, "versioned",
                'platform: "pytorch_libtorch"\nmax_batch_size: 4\n'
                'version_policy: { latest: { num_versions: 2 } }\n'
                + tensor_block("input", "INPUT__0", "TYPE_FP32", [1])
                + tensor_block("output", "OUTPUT__0", "TYPE_FP32", [1]),
                lambda version: AddConstant(float(version * 100)), versions=(1, 2, 3))

    # Dynamic batching: a busy model, a model whose queue is slow to flush (timeouts, caps,
    # cancellation), and one padded to its preferred batch size.
    row_io = (tensor_block("input", "INPUT__0", "TYPE_FP32", [4])
              + tensor_block("output", "OUTPUT__0", "TYPE_FP32", [4]))
    write_model(root, "batched",
                'platform: "pytorch_libtorch"\nmax_batch_size: 8\n' + row_io
                + "dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 5000 }\n"
                + "instance_group [{ kind: KIND_CPU count: 1 }]\n", RowMix())
    write_model(root, "slow_queue",
                'platform: "pytorch_libtorch"\nmax_batch_size: 8\n' + row_io
                + "dynamic_batching { max_queue_delay_microseconds: 1500000 "
                + "default_queue_policy { max_queue_size: 2 allow_timeout_override: true } }\n"
                + "instance_group [{ kind: KIND_CPU count: 1 }]\n", RowMix())
    write_model(root, "padded",
                'platform: "pytorch_libtorch"\nmax_batch_size: 8\n' + row_io
                + "dynamic_batching { preferred_batch_size: [ 4 ] }\n"
                + 'parameters { key: "sluice.pad_batch_to_preferred" value { string_value: "true" } }\n'
                + "instance_group [{ kind: KIND_CPU count: 1 }]\n", RowMix())

    # Broken models: each must be reported not ready with its reason while the others serve.
    good_io = (tensor_block("input", "INPUT__0", "TYPE_FP32", [2])
               + tensor_block("output", "OUTPUT__0", "TYPE_FP32", [2]))
    write_model(root, "broken_config", 'platform: "pytorch_libtorch"\nmax_batch_size: [oops\n')
    write_model(root, "broken_file", 'platform: "pytorch_libtorch"\nmax_batch_size: 4\n' + good_io)
    with open(os.path.join(root, "broken_file", "1", "model.pt"), "wb") as f:
        f.write(b"this is not a TorchScript archive")
    write_model(root, "missing_file", 'platform: "pytorch_libtorch"\nmax_batch_size: 4\n' + good_io)
    write_model(root, "wrong_arity",
                'platform: "pytorch_libtorch"\nmax_batch_size: 4\n'
                'input [{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ 2 ] },'
                ' { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 2 ] }]\n'
                + tensor_block("output", "OUTPUT__0", "TYPE_FP32", [2]), Double())
    write_model(root, "unsupported_feature",
                'platform: "pytorch_libtorch"\nmax_batch_size: 4\n' + good_io
                + "model_transaction_policy { decoupled: true }\n", Double())


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
