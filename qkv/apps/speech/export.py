"""The speech recogniser as ONNX graphs (:func:`qkv.apps.export.export_run`): Listen, Attend and Spell with a content
or location-aware score, the speech Transformer, each with or without a CTC head; a CTC model alone.

``encoder``: ``features (B, F, M)``, ``frames (B,)`` -> the state (the CTC log-probabilities ``ctc_log_probs``
among it); ``decoder_step``: ``tokens`` and the state -> the log-probabilities, the attention and the next state (the
location-aware score's previous weights are state). A CTC model alone has the encoder only. The run's decoding
settings are in the manifest for :mod:`qkv.export.runtime`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ...export.state import state_graphs

__all__ = ["graphs"]


def graphs(predictor) -> dict[str, Any]:
    from .task import decoding_options

    model, o = predictor.model, predictor.options
    attending = hasattr(model, "decode_step")
    gen = torch.Generator().manual_seed(0)

    def example(frames: int) -> tuple[Tensor, Tensor]:
        x = torch.randn(2, frames, o.n_mels, generator=gen)
        x[1, frames - 7:] = 0
        return x, torch.tensor([frames, frames - 7])

    settings = decoding_options(o)
    window = tuple(settings["window"] or ())
    has_ctc = getattr(model, "ctc_head", None) is not None
    extra = {"n_mels": o.n_mels, "max_rate": settings["max_rate"], "eos_threshold": settings["eos_threshold"],
             "length_penalty": settings["length_penalty"], "window": list(window),
             "ctc_weight": float(o.ctc_weight) if has_ctc and attending else (1.0 if has_ctc else 0.0),
             "model_max_len": getattr(model, "max_len", None), "max_len": getattr(model, "max_len", 1 << 20),
             "max_decode_len": o.max_decode_len}
    past = getattr(model, "max_len", None)
    positions = getattr(model, "frame_positions", None)  # a table of frame positions, after two halvings
    most = None if positions is None else 4 * positions.max_len
    return state_graphs(model, model.encode, example(48), example(61), ("features", "frames"),
                        ({0: "batch", 1: ("frames", 16, most)}, {0: "batch"}), extra=extra,
                        past_bound=None if past is None else past - 1,
                        constants={"window": window} if window else None, step=attending)
