"""The captioner as ONNX graphs (:func:`qkv.apps.export.export_run`): a Transformer captioner as ``encoder`` and
``decoder_step`` (the keys and values of every layer's self-attention as inputs and outputs), the recurrent
captioners as an encoder and a step over their decoding state (:mod:`qkv.export.state`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ...export.seq2seq import CaptionEncoder, CaptionStep, decoder_graphs

__all__ = ["graphs"]


def graphs(predictor) -> dict[str, tuple[nn.Module, tuple[Tensor, ...], dict[str, Any]]]:
    from ...models.caption_transformer import TransformerCaptioner

    model = predictor.model
    size = predictor.image_size
    pixels = torch.rand(2, predictor.channels, size, size, generator=torch.Generator().manual_seed(0))
    if not isinstance(model, TransformerCaptioner):  # the recurrent captioners: their state as named tensors
        from ...export.state import state_graphs

        return state_graphs(model, model.encode, (pixels,), (pixels,), ("pixels",), ({0: "batch"},),
                            extra={"image_size": size, "channels": predictor.channels, "length_penalty": 0.0,
                                   "max_len": 1 << 20})
    return decoder_graphs(model, CaptionEncoder(model), CaptionStep(model), (pixels,), ("memory",),
                           len(model.layers), model.positions.max_len,
                           {"image_size": size, "channels": predictor.channels, "length_penalty": 0.0})
