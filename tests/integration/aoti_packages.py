"""The AOTInductor packages test_aoti.py serves, and how they are compiled: kept apart from the
tests so that editing a test does not recompile them (the cache key hashes this file)."""
import os
import sys

import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "models"))
from model_cache import cached, source_key  # noqa: E402
from sluice_export import export_package  # noqa: E402

DTYPES = {  # protocol name -> torch dtype
    "BOOL": torch.bool, "UINT8": torch.uint8, "INT8": torch.int8, "INT16": torch.int16,
    "INT32": torch.int32, "INT64": torch.int64, "FP16": torch.float16, "BF16": torch.bfloat16,
    "FP32": torch.float32, "FP64": torch.float64,
}


class EveryDtype(nn.Module):
    """One input per datatype; returns a tuple: ~x for BOOL, x + x for the others."""

    def forward(self, b, u8, i8, i16, i32, i64, f16, bf16, f32, f64):
        return (~b, u8 + u8, i8 + i8, i16 + i16, i32 + i32, i64 + i64, f16 + f16, bf16 + bf16, f32 + f32, f64 + f64)


class ListOut(nn.Module):
    def forward(self, x):
        return [x * 2.0, x.sum(dim=1, keepdim=True)]


class DictOut(nn.Module):
    def forward(self, values, counts):
        return {"total": values + counts.to(torch.float32), "twice": counts * 2}


def example(dtype, shape):
    return (torch.arange(int(torch.tensor(shape).prod())).reshape(shape) % 3).to(dtype)


def build_every_dtype(path):
    inputs = tuple(example(dtype, (2, 4)) for dtype in DTYPES.values())
    batch = torch.export.Dim("batch", min=1, max=8)
    export_package(EveryDtype().eval(), inputs, path, dynamic_shapes=tuple({0: batch} for _ in inputs))


def build_list_min2(path):
    batch = torch.export.Dim("batch", min=2, max=8)
    export_package(ListOut().eval(), (torch.zeros(2, 3),), path, dynamic_shapes=({0: batch},))


def build_dict_fixed1(path):
    export_package(DictOut().eval(), (torch.zeros(1, 4), torch.zeros(1, 4, dtype=torch.int64)), path)


class Sequence(nn.Module):
    """Per-position: padding positions never change the others."""

    def forward(self, tokens):
        return tokens * 2.0 + 1.0


def build_sequence(path):
    batch = torch.export.Dim("batch", min=1, max=4)
    length = torch.export.Dim("length", min=2, max=16)
    export_package(Sequence().eval(), (torch.zeros(2, 5, 2),), path, dynamic_shapes=({0: batch, 1: length},))


def compiled_packages():
    """name -> path of each package, compiled into .cache/aoti-test unless already there."""
    cache = os.path.join(ROOT, ".cache", "aoti-test")
    key = source_key(os.path.abspath(__file__), os.path.join(ROOT, "models", "sluice_export.py"))
    return {name: cached(cache, f"{name}.pt2", key, build) for name, build in
            [("every_dtype", build_every_dtype), ("list_min2", build_list_min2),
             ("dict_fixed1", build_dict_fixed1), ("sequence", build_sequence)]}
