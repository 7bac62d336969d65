"""The bundled example models as torch modules: the networks behind models/mlp, models/convnet,
models/text_classifier and models/accumulator (TorchScript, built by build()) and the mlp_aoti and
convnet_aoti AOTInductor packages (export()). Weights come from a fixed seed, so every machine
serves the same numbers. models/generate_models.py writes them into a repository, through a
cache; import this module for the classes (a test's own variant of the accumulator, a package
compiled for a GPU).
"""
import os
import sys
from typing import Dict, List, Tuple

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sluice_export import export_package  # noqa: E402


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


class ImageNormaliser(nn.Module):
    """The first step of the bundled convnet_pipeline ensemble: pixels as a camera gives them
    (0..255, FP32 [3, 32, 32]) to what the convnet takes: scaled to [0, 1], then centred and scaled
    by CIFAR-10's per-channel mean and standard deviation."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return (pixels / 255.0 - self.mean) / self.std


class TopClasses(nn.Module):
    """The last step of convnet_pipeline: the convnet's three likeliest classes per image, their
    softmax scores and indices."""

    def forward(self, logits: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        scores, classes = torch.softmax(logits, dim=1).topk(3, dim=1)
        return scores, classes


class TextClassifier(nn.Module):
    """A character-level classifier of raw strings (TYPE_STRING in, List[str] for the model): the
    share of each string's characters in five classes, and the name of the largest ("empty" for an
    empty string). TorchScript iterates a str by UTF-8 byte, so a non-ASCII character counts once
    per byte, as a letter."""

    def __init__(self):
        super().__init__()
        self.classes: List[str] = ["digits", "letters", "space", "punctuation", "other"]
        table = torch.zeros(129, len(self.classes))  # 128 ASCII codes, then every byte >= 128
        for code in range(128):
            ch = chr(code)
            k = 0 if ch.isdigit() else 1 if ch.isalpha() else 2 if ch.isspace() else 3 if 33 <= code < 127 else 4
            table[code, k] = 1.0
        table[128, 1] = 1.0
        self.register_buffer("table", table)

    def forward(self, TEXT: List[str]) -> Tuple[torch.Tensor, List[str]]:
        counts = torch.zeros(len(TEXT), 129)
        for i, text in enumerate(TEXT):
            codes = torch.tensor([min(ord(ch), 128) for ch in text], dtype=torch.long)
            counts[i] = torch.bincount(codes, minlength=129).to(torch.float32)
        scores = (counts / counts.sum(1, keepdim=True).clamp(min=1.0)) @ self.table
        labels: List[str] = []
        for i, text in enumerate(TEXT):
            labels.append(self.classes[int(scores[i].argmax())] if len(text) > 0 else "empty")
        return scores, labels


class Accumulator(nn.Module):
    """A running sum per sequence, for sequence_batching (models/accumulator/config.pbtxt): each
    row is one request of one sequence; OUTPUT is the sum of INPUT over the sequence so far. The
    state lives in the model, keyed by the correlation id the server passes in CORRID: START resets
    it, END forgets it, and rows with READY off (empty slots, warm-up) change nothing and return 0.
    Each instance is its own module, and the server keeps a sequence on one instance. (`scale`
    multiplies each input: the tests' second version uses 10 to show which version answered.)"""

    totals: Dict[int, int]

    def __init__(self, scale: int = 1):
        super().__init__()
        self.scale = scale
        self.totals = {}

    def forward(self, INPUT: torch.Tensor, START: torch.Tensor, END: torch.Tensor, READY: torch.Tensor,
                CORRID: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(INPUT)
        for row in range(INPUT.size(0)):
            if int(READY[row, 0]) == 0:
                continue
            key = int(CORRID[row, 0])
            total = self.scale * int(INPUT[row, 0])
            if int(START[row, 0]) == 0 and key in self.totals:
                total += self.totals[key]
            out[row, 0] = total
            if int(END[row, 0]) != 0:
                if key in self.totals:
                    self.totals.pop(key)
            else:
                self.totals[key] = total
        return out


def build(name):
    torch.manual_seed(0)
    if name == "mlp":
        return torch.jit.script(Mlp().eval())
    if name == "text_classifier":
        return torch.jit.script(TextClassifier().eval())
    if name == "accumulator":
        return torch.jit.script(Accumulator().eval())
    if name == "image_normaliser":
        return torch.jit.script(ImageNormaliser().eval())
    if name == "top_classes":
        return torch.jit.script(TopClasses().eval())
    if name == "convnet":
        with torch.no_grad():
            return torch.jit.trace(ConvNet().eval(), torch.zeros(1, 3, 32, 32))
    raise ValueError(name)


def package_module(name):
    """The module and an example input of package `name` ("mlp_aoti" or "convnet_aoti"), and its
    largest batch: the same weights as the TorchScript model it mirrors."""
    torch.manual_seed(0)
    if name == "mlp_aoti":
        return Mlp().eval(), torch.zeros(2, 784), 64
    if name == "convnet_aoti":
        # 8, not the TorchScript model's 32: in torch 2.11 inductor compiles this network's
        # package for batches of at most 15 whatever the export declares (see
        # sluice_export.accepted_batches).
        return ConvNet().eval(), torch.zeros(2, 3, 32, 32), 8
    raise ValueError(name)


def export(name, path, device="cpu"):
    """The package of `name` for `device`, batch 1..max_batch_size."""
    module, example, max_batch = package_module(name)
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    export_package(module.to(device), (example.to(device),), path, dynamic_shapes=({0: batch},))
