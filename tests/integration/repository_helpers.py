"""Small TorchScript models and repository writers shared by the integration tests and the GPU
proof kit (scripts/gpu_kit): nothing here needs more than torch, so the kit can import it on a
machine without the test-only packages."""
import os
import re

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.up = nn.ConvTranspose2d(4, 2, 2, stride=2)

    def forward(self, x):
        return self.up(torch.relu(self.conv(x)))


class TracedConvs(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, image):
        return self.block(image).mean(dim=(2, 3))


def write(root, name, config, module):
    """Writes <root>/<name>/config.pbtxt and version 1's model.pt."""
    os.makedirs(os.path.join(root, name, "1"), exist_ok=True)
    with open(os.path.join(root, name, "config.pbtxt"), "w") as f:
        f.write(config)
    module.save(os.path.join(root, name, "1", "model.pt"))


def traced_convs_module():
    torch.manual_seed(7)
    model = TracedConvs().eval()
    return torch.jit.trace(model, torch.randn(1, 3, 8, 8))


def warmed_pairs(log, model):
    """The (instance, shape) pairs the server's debug log says it warmed up for version 1."""
    return {(int(m.group(1)), m.group(2)) for m in re.finditer(
        rf"event=warmup_pass model={model} version=1 instance=(\d+) shape=\"([^\"]+)\"", log)}
