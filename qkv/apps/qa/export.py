"""The reader as one ONNX graph, ``model.onnx`` (:func:`qkv.apps.export.export_run`): the context and question ids in,
the answer span and its scores out."""

from __future__ import annotations

from typing import Any

from ...export.classify import ReaderGraph

__all__ = ["graphs"]


def graphs(predictor) -> dict[str, Any]:
    from .encode import collate_qa, encode_example

    pairs = [("the cat sat on the mat near the door", "where did the cat sit ?"),
             ("a dog ran", "who ran ?")]
    batch = collate_qa([encode_example(c, q, predictor.tokenizer, max_question=predictor.options.max_question)
                        for c, q in pairs])
    o = predictor.options
    extra = {"max_answer_len": o.max_answer_len, "max_context": o.max_context, "stride": o.stride,
             "max_question": o.max_question}
    example = tuple(batch[k] for k in ReaderGraph.inputs)
    from ...layers.transformer import PositionalEncoding

    tables = [m.max_len for m in predictor.model.modules() if isinstance(m, PositionalEncoding)]
    return {"model": (ReaderGraph(predictor.model, o.max_answer_len, min(tables) if tables else None), example,
                      extra)}
