"""Per application: the graphs of a loaded predictor, each ``name -> (module, example inputs, manifest extras)``.

Examples are small; every axis named in a graph's ``dynamic`` is free in the exported graph.
"""

from __future__ import annotations

from typing import Any

import torch

from .classify import SEGMENT_MIN_SIZE, ImageGraph, ReaderGraph, SegmentGraph, SentimentGraph

__all__ = ["sentiment", "images", "segment", "translate", "caption", "summarize", "speech", "qa"]

Graphs = dict[str, tuple[torch.nn.Module, tuple[torch.Tensor, ...], dict[str, Any]]]


def sentiment(predictor) -> Graphs:
    vocab = predictor.tokenizer.vocab_size
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, max(vocab, 5), (2, 7), generator=gen)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    ids[1, 5:] = 0
    extra = {"max_len": predictor.max_len, "labels": list(predictor.label_names),
             "regression": bool(predictor.regression)}
    return {"model": (SentimentGraph(predictor.model), (ids, mask), extra)}


def images(predictor) -> Graphs:
    h, w = predictor.image_size
    pixels = torch.rand(2, 1, h, w, generator=torch.Generator().manual_seed(0))
    extra = {"image_size": [h, w], "class_names": list(predictor.class_names)}
    return {"model": (ImageGraph(predictor.model, [predictor.mean], [predictor.std]), (pixels,), extra)}


def segment(predictor) -> Graphs:
    pixels = torch.rand(2, predictor.channels, 64, 96, generator=torch.Generator().manual_seed(0))
    extra = {"class_names": list(predictor.class_names), "min_size": SEGMENT_MIN_SIZE}
    return {"model": (SegmentGraph(predictor.model, predictor.mean, predictor.std), (pixels,), extra)}


def translate(predictor) -> Graphs:
    from .seq2seq import translate_graphs

    return translate_graphs(predictor)


def caption(predictor) -> Graphs:
    from .seq2seq import caption_graphs

    return caption_graphs(predictor)


def summarize(predictor) -> Graphs:
    from .decoders import summarize_graphs

    return summarize_graphs(predictor)


def speech(predictor) -> Graphs:
    from .decoders import speech_graphs

    return speech_graphs(predictor)


def qa(predictor) -> Graphs:
    from ..apps.qa.encode import collate_qa, encode_example

    pairs = [("the cat sat on the mat near the door", "where did the cat sit ?"),
             ("a dog ran", "who ran ?")]
    batch = collate_qa([encode_example(c, q, predictor.tokenizer, max_question=predictor.options.max_question)
                        for c, q in pairs])
    o = predictor.options
    extra = {"max_answer_len": o.max_answer_len, "max_context": o.max_context, "stride": o.stride,
             "max_question": o.max_question}
    example = tuple(batch[k] for k in ReaderGraph.inputs)
    from ..layers.transformer import PositionalEncoding

    tables = [m.max_len for m in predictor.model.modules() if isinstance(m, PositionalEncoding)]
    return {"model": (ReaderGraph(predictor.model, o.max_answer_len, min(tables) if tables else None), example,
                      extra)}
