"""The segmentation network as one ONNX graph, ``model.onnx`` (:func:`qkv.apps.export.export_run`): pixels in
(normalised inside the graph), the label of every pixel out."""

from __future__ import annotations

from typing import Any

import torch

from ...export.classify import SEGMENT_MIN_SIZE, SegmentGraph

__all__ = ["graphs"]


def graphs(predictor) -> dict[str, Any]:
    pixels = torch.rand(2, predictor.channels, 64, 96, generator=torch.Generator().manual_seed(0))
    extra = {"class_names": list(predictor.class_names), "min_size": SEGMENT_MIN_SIZE}
    return {"model": (SegmentGraph(predictor.model, predictor.mean, predictor.std), (pixels,), extra)}
