"""Summarisation and speech recognition as an encoder graph and a decoder step graph over the decoding state
(:mod:`qkv.export.state`), with the run's decoding settings in the manifest for :mod:`qkv.export.runtime`.

- summarisation (pointer-generator with or without coverage, its baseline without copying, the Transformer
  pointer): ``encoder``: ``src``, ``src_mask``, ``src_ext`` ``(B, S)`` -> the state; ``decoder_step``: ``tokens``,
  the state and ``ext_slots (N, X)`` -> ``logits``: log-probabilities over the extended vocabulary ``V + X`` (the
  copy distribution mixed in), the copy ``attention`` and the next recurrent state, coverage and caches;
- speech (Listen, Attend and Spell with a content or location-aware score, the speech Transformer, each with or
  without a CTC head; a CTC model alone): ``encoder``: ``features (B, F, M)``, ``frames (B,)`` -> the state
  (the CTC log-probabilities ``ctc_log_probs`` among it); ``decoder_step`` as above (the location-aware score's
  previous weights are state). A CTC model alone has the encoder only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .seq2seq import longest, sources
from .state import state_graphs

__all__ = ["summarize_graphs", "speech_graphs"]


def summarize_graphs(predictor) -> dict[str, Any]:
    from ..models.pointer import TransformerPointer

    model = predictor.model
    v = model.vocab

    def example(length: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
        src, mask = sources(v, length, seed)
        ext = src.clone()
        ext[0, 1], ext[0, 3] = v, v + 1  # two source words outside the vocabulary
        src[0, 1], src[0, 3] = 3, 3
        return src, mask, ext

    transformer = isinstance(model, TransformerPointer)
    bound = longest(model) if transformer else None
    extra = {"vocab": v, "copy": bool(model.copy), "feed_below": v + getattr(model, "oov_slots", 0),
             "max_len": bound or 1 << 20, "length_penalty": 0.0, "no_repeat_ngram_size": 3,
             "max_decode_len": predictor.options.max_decode_len, "max_source": predictor.options.max_source}
    return state_graphs(model, lambda src, mask, ext: model.encode(src, mask, ext, 0), example(6, 0),
                        example(9, 1), ("src", "src_mask", "src_ext"),
                        tuple({0: "batch", 1: ("source", None, bound)} for _ in range(3)), extra=extra,
                        source_bound=bound, past_bound=None if bound is None else bound - 1)


def speech_graphs(predictor) -> dict[str, Any]:
    from ..apps.speech.task import decoding_options

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
