"""The translator as ONNX graphs (:func:`qkv.apps.export.export_run`): a Transformer as ``encoder`` and
``decoder_step`` (the keys and values of every layer's self-attention as inputs and outputs), the recurrent
translators as an encoder and a step over their decoding state (:mod:`qkv.export.state`)."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ...export.seq2seq import TransformerEncoder, TransformerStep, decoder_graphs, longest, sources

__all__ = ["graphs"]


def graphs(predictor) -> dict[str, tuple[nn.Module, tuple[Tensor, ...], dict[str, Any]]]:
    from ...models.transformer import TransformerSeq2Seq

    model = predictor.model
    vocab = predictor.src_tokenizer.vocab_size
    src, src_mask = sources(vocab, 6)
    if not isinstance(model, TransformerSeq2Seq):  # the recurrent translators: their state as named tensors
        from ...export.state import state_graphs

        return state_graphs(model, model.encode, (src, src_mask), sources(vocab, 9), ("src", "src_mask"),
                            ({0: "batch", 1: "source"}, {0: "batch", 1: "source"}),
                            extra={"length_penalty": 0.6, "max_len": 1 << 20})
    return decoder_graphs(model, TransformerEncoder(model), TransformerStep(model), (src, src_mask),
                           ("memory", "src_mask"), len(model.decoder), longest(model), {"length_penalty": 0.6})
