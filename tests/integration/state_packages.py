"""The AOTInductor package test_sequence_state.py serves, compiled once into .cache/aoti-test
(the cache key hashes this file): kept apart from the test so that editing it recompiles nothing."""
import os
import sys

import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "models"))
from model_cache import cached, source_key  # noqa: E402
from sluice_export import export_package  # noqa: E402


class PackagedAccumulator(nn.Module):
    """A running sum whose total the server keeps as implicit state (forward(value, state))."""

    def forward(self, value, state):
        total = state + value
        return total, total


def build_accumulator(path):
    batch = torch.export.Dim("batch", min=1, max=4)
    example = torch.zeros(2, 1, dtype=torch.int32)
    export_package(PackagedAccumulator().eval(), (example, example.clone()), path,
                   dynamic_shapes=({0: batch}, {0: batch}))


def state_accumulator_package():
    """The path of the compiled package (built first unless the cache holds it)."""
    cache = os.path.join(ROOT, ".cache", "aoti-test")
    key = source_key(os.path.abspath(__file__), os.path.join(ROOT, "models", "sluice_export.py"))
    return cached(cache, "state_accumulator.pt2", key, build_accumulator)
