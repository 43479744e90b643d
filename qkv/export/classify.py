"""The one-graph applications: sentiment (token ids -> logits and the pooling's weights), images (pixels ->
logits), segmentation (pixels -> per-pixel logits) and question answering's reader (a context and a question ->
the answer span). Pixels enter in ``[0, 1]`` and are normalised inside the
graph with the run's mean and standard deviation, as the predictors do."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = ["SentimentGraph", "ImageGraph", "SegmentGraph", "ReaderGraph"]


class SentimentGraph(nn.Module):
    """``ids (B, T)`` int64, ``mask (B, T)`` bool (True at tokens) -> ``logits (B, C)``, ``weights``: the pooling's
    attention over the tokens, as the predictor reports it (``(B, T)``, averaged over hops)."""

    inputs = ("ids", "mask")
    outputs = ("logits", "weights")
    dynamic = ({0: "batch", 1: "tokens"}, {0: "batch", 1: "tokens"})

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        res = self.model(ids, mask)
        weights = res.weights.float()
        return res.logits.float(), weights.mean(1) if weights.dim() == 3 else weights


class _Pixels(nn.Module):
    def __init__(self, model: nn.Module, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.model = model
        # (named apart from the exporter's node names: an ONNX graph names each value once)
        self.register_buffer("pixel_mean", torch.tensor(list(mean), dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("pixel_std", torch.tensor(list(std), dtype=torch.float32).view(1, -1, 1, 1))

    def normalized(self, pixels: Tensor) -> Tensor:
        return (pixels - self.pixel_mean) / self.pixel_std


class ImageGraph(_Pixels):
    """``pixels (B, C, H, W)`` float in [0, 1] at the trained size -> ``logits (B, K)``."""

    inputs = ("pixels",)
    outputs = ("logits",)
    dynamic = ({0: "batch"},)

    def forward(self, pixels: Tensor) -> Tensor:
        return self.model(self.normalized(pixels)).float()


#: the smallest height and width a segmentation graph takes: its deepest features are at 1/32 of the image, and
#: the exporter makes a graph for feature maps of more than one pixel
SEGMENT_MIN_SIZE = 33


class SegmentGraph(_Pixels):
    """``pixels (B, C, H, W)`` float in [0, 1], ``H, W >= 33`` -> ``logits (B, K, H, W)``."""

    inputs = ("pixels",)
    outputs = ("logits",)
    dynamic = ({0: "batch", 2: ("height", SEGMENT_MIN_SIZE, None), 3: ("width", SEGMENT_MIN_SIZE, None)},)

    def forward(self, pixels: Tensor) -> Tensor:
        return self.model(self.normalized(pixels)).float()


class ReaderGraph(nn.Module):
    """Question answering's reader over one window of a context: ``context``, ``context_mask``, ``question``,
    ``question_mask`` ``(B, Tc)``/``(B, Tq)`` (ids int64, masks bool), ``match (B, Tc)`` float (the token flags:
    1 where a context token occurs in the question, plus 2 where it starts with a capital letter) ->
    ``start_logits``, ``end_logits`` ``(B, Tc)``, ``attention (B, Tc)`` (the reader's attention over the context),
    and the best span as :func:`qkv.models.reading.decode_spans` finds it:
    ``start``, ``end`` ``(B,)`` token indices and its ``probability`` ``p_start * p_end``."""

    inputs = ("context", "context_mask", "question", "question_mask", "match")
    outputs = ("start_logits", "end_logits", "attention", "start", "end", "probability")

    def __init__(self, model: nn.Module, max_answer_len: int, longest: int | None = None):
        super().__init__()
        self.model, self.max_answer_len = model, max_answer_len
        # (a Transformer reader reads at most its table of positions)
        ctx, q = {0: "batch", 1: ("context", None, longest)}, {0: "batch", 1: ("question", None, longest)}
        self.dynamic = (ctx, ctx, q, q, ctx)

    def forward(self, context: Tensor, context_mask: Tensor, question: Tensor, question_mask: Tensor,
                match: Tensor) -> tuple[Tensor, ...]:
        from ..models.reading import decode_spans

        res = self.model(context, context_mask, question, question_mask, match)
        start, end, prob = decode_spans(res.start_logits, res.end_logits, context_mask, self.max_answer_len)
        return res.start_logits.float(), res.end_logits.float(), res.attention.float(), start, end, prob.float()
