"""The image classifier as one ONNX graph, ``model.onnx`` (:func:`qkv.apps.export.export_run`): pixels in (normalised
inside the graph), the class scores out."""

from __future__ import annotations

from typing import Any

import torch

from ...export.classify import ImageGraph

__all__ = ["graphs"]


def graphs(predictor) -> dict[str, Any]:
    h, w = predictor.image_size
    pixels = torch.rand(2, 1, h, w, generator=torch.Generator().manual_seed(0))
    extra = {"image_size": [h, w], "class_names": list(predictor.class_names)}
    return {"model": (ImageGraph(predictor.model, [predictor.mean], [predictor.std]), (pixels,), extra)}
