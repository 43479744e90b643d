"""The text classifier as one ONNX graph, ``model.onnx`` (:func:`qkv.apps.export.export_run`): token ids and their mask
in, the class scores and the pooled attention out."""

from __future__ import annotations

from typing import Any

import torch

from ...export.classify import SentimentGraph

__all__ = ["graphs"]


def graphs(predictor) -> dict[str, Any]:
    vocab = predictor.tokenizer.vocab_size
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, max(vocab, 5), (2, 7), generator=gen)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    ids[1, 5:] = 0
    extra = {"max_len": predictor.max_len, "labels": list(predictor.label_names),
             "regression": bool(predictor.regression)}
    return {"model": (SentimentGraph(predictor.model), (ids, mask), extra)}
