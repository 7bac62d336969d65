"""Models that call torchvision's operators, for test_operator_libraries.py and the GPU proof kit
(scripts/gpu_kit/steps/81_torchvision_ops.py): one calling all six operators the server bundles,
and a torchvision Faster R-CNN wrapped to take one image and return tensors. Only torch,
torchvision and numpy here (the GPU machine has no pytest or tritonclient.http)."""
from typing import Tuple

import numpy as np
import torch
import torchvision
from torch import nn


class VisionOps(nn.Module):
    """Every torchvision operator the server bundles: nms, roi_align, roi_pool, ps_roi_align,
    ps_roi_pool and deform_conv2d."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(7)
        self.weight = nn.Parameter(torch.randn(4, 18, 3, 3, generator=generator), requires_grad=False)

    def forward(self, BOXES: torch.Tensor, SCORES: torch.Tensor, FEATURES: torch.Tensor,
                ROIS: torch.Tensor, OFFSET: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                   torch.Tensor, torch.Tensor, torch.Tensor]:
        keep = torchvision.ops.nms(BOXES, SCORES, 0.5)
        aligned = torchvision.ops.roi_align(FEATURES, ROIS, [3, 3], 0.5, 2, True)
        pooled = torchvision.ops.roi_pool(FEATURES, ROIS, [3, 3], 0.5)
        ps_aligned = torchvision.ops.ps_roi_align(FEATURES, ROIS, 3, 0.5, 2)
        ps_pooled = torchvision.ops.ps_roi_pool(FEATURES, ROIS, 3, 0.5)
        deformed = torchvision.ops.deform_conv2d(FEATURES, OFFSET, self.weight, padding=(1, 1))
        return keep, aligned, pooled, ps_aligned, ps_pooled, deformed


VISION_CONFIG = """
max_batch_size: 0
input [
  { name: "BOXES" data_type: TYPE_FP32 dims: [ -1, 4 ] },
  { name: "SCORES" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "FEATURES" data_type: TYPE_FP32 dims: [ 1, 18, 16, 16 ] },
  { name: "ROIS" data_type: TYPE_FP32 dims: [ -1, 5 ] },
  { name: "OFFSET" data_type: TYPE_FP32 dims: [ 1, 18, 16, 16 ] }
]
output [
  { name: "KEEP__0" data_type: TYPE_INT64 dims: [ -1 ] },
  { name: "ALIGNED__1" data_type: TYPE_FP32 dims: [ -1, 18, 3, 3 ] },
  { name: "POOLED__2" data_type: TYPE_FP32 dims: [ -1, 18, 3, 3 ] },
  { name: "PS_ALIGNED__3" data_type: TYPE_FP32 dims: [ -1, 2, 3, 3 ] },
  { name: "PS_POOLED__4" data_type: TYPE_FP32 dims: [ -1, 2, 3, 3 ] },
  { name: "DEFORMED__5" data_type: TYPE_FP32 dims: [ 1, 4, 16, 16 ] }
]
"""

VISION_OUTPUTS = ["KEEP__0", "ALIGNED__1", "POOLED__2", "PS_ALIGNED__3", "PS_POOLED__4", "DEFORMED__5"]


def vision_inputs():
    rng = np.random.default_rng(3)
    corners = rng.uniform(0, 24, size=(40, 2)).astype(np.float32)
    boxes = np.concatenate([corners, corners + rng.uniform(2, 8, size=(40, 2)).astype(np.float32)], axis=1)
    rois = np.concatenate([np.zeros((6, 1), np.float32), boxes[:6]], axis=1)
    return {
        "BOXES": boxes,
        "SCORES": rng.uniform(0, 1, size=40).astype(np.float32),
        "FEATURES": rng.standard_normal((1, 18, 16, 16)).astype(np.float32),
        "ROIS": rois,
        "OFFSET": (0.5 * rng.standard_normal((1, 18, 16, 16))).astype(np.float32),
    }


class Detector(nn.Module):
    """A torchvision Faster R-CNN for one image: boxes, scores and labels."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
            weights=None, weights_backbone=None, box_score_thresh=0.0, num_classes=5).eval()

    def forward(self, IMAGE: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        _, detections = self.model([IMAGE])
        return detections[0]["boxes"], detections[0]["scores"], detections[0]["labels"]


DETECTOR_CONFIG = """
max_batch_size: 0
input [ { name: "IMAGE" data_type: TYPE_FP32 dims: [ 3, -1, -1 ] } ]
output [
  { name: "BOXES__0" data_type: TYPE_FP32 dims: [ -1, 4 ] },
  { name: "SCORES__1" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "LABELS__2" data_type: TYPE_INT64 dims: [ -1 ] }
]
"""




def config(text, kind="KIND_CPU"):
    """A model config of this module with one instance of `kind`."""
    return text + f"instance_group [ {{ kind: {kind} count: 1 }} ]\n"
