#!/usr/bin/env python3
"""Writes the TorchScript files of the bundled example models (models/<name>/1/model.pt).

The configs (config.pbtxt) are committed; the weights are not: they are made here from a fixed
seed, so every machine serves the same numbers. Run with the venv's python (scripts/setup.sh):

    .venv/bin/python models/generate_models.py [--repository DIR] [--force] [--models NAME ...]
"""
import argparse
import os

import torch
from torch import nn


class Mlp(nn.Module):
    """784-512-512-10 with ReLU."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                    nn.Linear(512, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class ConvNet(nn.Module):
    """Two conv/ReLU/max-pool stages and a linear classifier for 3x32x32 images."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Linear(32 * 8 * 8, 10)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(image), 1))


def build(name):
    torch.manual_seed(0)
    if name == "mlp":
        return torch.jit.script(Mlp().eval())
    if name == "convnet":
        with torch.no_grad():
            return torch.jit.trace(ConvNet().eval(), torch.zeros(1, 3, 32, 32))
    raise ValueError(name)


MODELS = ("mlp", "convnet")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--repository", default=here, help="model repository to write into")
    parser.add_argument("--force", action="store_true", help="rewrite existing files")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS),
                        help="which models to write (default: all)")
    args = parser.parse_args()
    for name in args.models:
        path = os.path.join(args.repository, name, "1", "model.pt")
        if os.path.exists(path) and not args.force:
            print(f"{path}: present")
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        build(name).save(path)
        print(f"{path}: written")


if __name__ == "__main__":
    main()
