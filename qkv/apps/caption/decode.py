"""Captioning's decoding (greedy / beam search, one attention map per word: :func:`caption_images` and its result
:class:`Caption`) and its metric (:func:`caption_metrics`: BLEU-1..4, exact match, grounding, and on scenes exact
match by number of items, on held-out combinations and on the layout alone); :func:`evaluate_captions` joins them
for the trainer and the predictor alike."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ...train.threads import batch_starts
from .data import CaptionData

__all__ = ["Caption", "caption_images", "caption_metrics", "evaluate_captions"]


@dataclass
class Caption:
    """One caption: its ``text`` and ``words``, ``attention (len(words), h, w)`` (the map each word was produced
    with), the beam ``score`` (log-probability) and why decoding ``stopped`` (``"end"``, or ``"max_len"``: it had
    the most words allowed)."""

    text: str
    words: list[str]
    attention: Tensor
    score: float
    stopped: str = "end"


def caption_images(model: nn.Module, tokenizer, images: Tensor, *, beam: int = 1, max_len: int = 40,
                   batch_size: int = 100, length_penalty: float = 0.0) -> list[Caption]:
    """Caption ``images (N, C, S, S)`` (uint8, or float in [0, 1]) with ``model`` (greedy when ``beam`` is 1),
    through the one decoder: the images are the model's encoder input, its attention rows the maps."""
    from ...models.decoding import beam_search

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    h, w = images.shape[-2] // 8, images.shape[-1] // 8
    out: list[Caption] = []
    try:
        with torch.no_grad():
            for start in batch_starts(len(images), batch_size, device=device):
                x = images[start:start + batch_size]
                x = (x.float() / 255.0 if x.dtype == torch.uint8 else x.float()).to(device)
                for hyp in beam_search(model, x, beam=beam, max_len=max_len, length_penalty=length_penalty):
                    words = tokenizer.tokens_of_ids(hyp.tokens)
                    out.append(Caption(tokenizer.decode(hyp.tokens), words,
                                       hyp.attention[:len(words)].reshape(len(words), h, w), hyp.score,
                                       hyp.stopped))
    finally:
        model.train(was_training)
    return out


def _layout(text: str, items: set[str]) -> str:
    return " ".join("X" if w in items else w for w in text.split())


def caption_metrics(hyps: Sequence[str], refs: Sequence[Sequence[str]], *, captions: Sequence[Caption] | None = None,
                    scenes: Sequence | None = None, item_words: Sequence[str] = (),
                    image_size: int = 64) -> dict[str, float]:
    """BLEU-1..4 and exact match of ``hyps`` against every reference; with ``scenes`` (and the ``captions``'
    attention) also: ``grounding`` (mean share of a named item's attention inside its box, a word naming an
    item the scene does not hold counting 0) and ``grounding_above`` (share of such words above 0.5),
    ``exact_match_items{1..4}`` (by number of items), ``exact_match_unseen`` (scenes with a held-out item/cell
    combination) and ``layout_match`` (exact match with every item word replaced by one placeholder: positions,
    relations and counts right, whatever the items)."""
    from ...metrics import box_mass, caption_bleu, exact_match, grounding

    metrics = {**caption_bleu(hyps, refs), "exact_match": exact_match(hyps, refs), "images": float(len(hyps))}
    if scenes is None:
        return metrics
    items = set(item_words)
    masses = []
    for c, scene in zip(captions or [], scenes, strict=True):
        boxes = dict(zip(scene.items, scene.boxes, strict=True))
        for t, word in enumerate(c.words):
            if word in items:
                masses.append(box_mass(c.attention[t], boxes[word], (image_size, image_size)) if word in boxes
                              else 0.0)
    metrics.update(grounding(masses))
    for n in range(1, 5):
        sel = [i for i, s in enumerate(scenes) if len(s.items) == n]
        metrics[f"exact_match_items{n}"] = exact_match([hyps[i] for i in sel], [refs[i] for i in sel])
    unseen = [i for i, s in enumerate(scenes) if s.held_out]
    metrics["exact_match_unseen"] = exact_match([hyps[i] for i in unseen], [refs[i] for i in unseen])
    metrics["layout_match"] = exact_match([_layout(h, items) for h in hyps],
                                          [[_layout(r, items) for r in rs] for rs in refs])
    return metrics


def evaluate_captions(model: nn.Module, tokenizer, data: CaptionData, split: str, *, limit: int | None, beam: int,
                      max_len: int) -> dict[str, float]:
    """:func:`caption_metrics` of ``model`` captioning the first ``limit`` images of ``split`` of ``data``."""
    if split not in ("valid", "test"):
        raise ValueError(f"no split {split!r}; one of valid, test")
    part = data.splits[split].head(limit or len(data.splits[split]))
    captions = caption_images(model, tokenizer, part.batch(range(len(part))), beam=beam, max_len=max_len)
    return caption_metrics([c.text for c in captions], part.references, captions=captions, scenes=part.scenes,
                           item_words=data.item_words, image_size=data.image_size)
