"""The text classifier as one ONNX graph, ``model.onnx`` (:func:`qkv.apps.export.export_run`): token ids and their
mask in, the class scores and the pooled attention out; the run's labels and length limit in the manifest."""

from __future__ import annotations

from typing import Any

from ..export import text_classifier_graphs

__all__ = ["graphs"]


def graphs(predictor) -> dict[str, Any]:
    return text_classifier_graphs(predictor, max_len=predictor.max_len, labels=list(predictor.label_names),
                                  regression=bool(predictor.regression))
