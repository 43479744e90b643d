"""The summariser as ONNX graphs (:func:`qkv.apps.export.export_run`): an encoder graph and a decoder step graph
over the decoding state (:mod:`qkv.export.state`), with the run's decoding settings in the manifest for
:mod:`qkv.export.runtime`.

The pointer-generator with or without coverage, its baseline without copying, and the Transformer pointer:
``encoder``: ``src``, ``src_mask``, ``src_ext`` ``(B, S)`` -> the state; ``decoder_step``: ``tokens``, the state and
``ext_slots (N, X)`` -> ``logits``: log-probabilities over the extended vocabulary ``V + X`` (the copy distribution
mixed in), the copy ``attention`` and the next recurrent state, coverage and caches.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ...export.seq2seq import longest, sources
from ...export.state import state_graphs

__all__ = ["graphs"]


def graphs(predictor) -> dict[str, Any]:
    from ...models.pointer import TransformerPointer

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
