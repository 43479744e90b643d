"""The captioning task's data splits, its decoding (greedy / beam search, one attention map per word) and its
metrics (BLEU-1..4, exact match, grounding, and on scenes exact match by number of items, on held-out
combinations and on the layout alone). Used by :mod:`qkv.tasks.caption`."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

logger = logging.getLogger(__name__)

__all__ = ["CaptionSplit", "CaptionData", "CaptionExamples", "Caption", "load_caption_data", "caption_images",
           "caption_metrics"]


@dataclass
class CaptionSplit:
    """A split: ``images`` (a ``(N, C, S, S)`` uint8 tensor, or image files read when needed), every image's
    ``references``, and for scenes their :class:`~qkv.data.scenes.Scene` s (items, boxes)."""

    images: Tensor | list[Path]
    references: list[list[str]]
    scenes: list | None = None
    image_size: int = 64
    grey: bool = True

    def __len__(self) -> int:
        return len(self.references)

    def image(self, i: int) -> Tensor:
        """Image ``i``, ``(C, S, S)`` uint8."""
        if isinstance(self.images, Tensor):
            return self.images[i]
        from ...data.captions import load_image

        return load_image(self.images[i], self.image_size, grey=self.grey)

    def batch(self, index: Iterable[int]) -> Tensor:
        """``(N, C, S, S)`` uint8 of the images ``index``."""
        return torch.stack([self.image(i) for i in index])

    def head(self, n: int) -> CaptionSplit:
        """The first ``n`` images."""
        return CaptionSplit(self.images[:n], self.references[:n], None if self.scenes is None else self.scenes[:n],
                            self.image_size, self.grey)


@dataclass
class CaptionData:
    """``{"train", "valid", "test": CaptionSplit}``, the images' size and channels, and (scenes) the item words."""

    splits: dict[str, CaptionSplit]
    image_size: int
    channels: int
    item_words: list[str]


class CaptionExamples:
    """Indexable ``(image (C, S, S) uint8, [reference ids, ...])`` for the trainer (references cut to ``max_len``
    words)."""

    def __init__(self, split: CaptionSplit, tokenizer, max_len: int):
        self.split = split
        self.refs = [[tokenizer.encode(r)[:max_len] for r in refs] for refs in split.references]

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i: int):
        return self.split.image(i), self.refs[i]


def load_caption_data(data: str, *, images: str | None = None, on_error: str = "raise", image_size: int = 128,
                      grey: bool = False, valid: float = 0.05, test: float = 0.05, n_train: int = 10_000,
                      n_valid: int = 500, n_test: int = 1_000, scenes_root: str | None = None,
                      seed: int = 0) -> CaptionData:
    """Generated scenes (``data="scenes"``) or a captions file split by images (a seeded permutation)."""
    if data == "scenes":
        from ...data.scenes import CANVAS, make_scenes

        sd = make_scenes(n_train, n_valid, n_test, seed=seed, root=scenes_root)
        splits = {name: CaptionSplit(s.images[:, None], [sc.captions for sc in s.scenes], s.scenes, CANVAS, True)
                  for name, s in sd.splits.items()}
        return CaptionData(splits, CANVAS, 1, sd.item_words)
    from ...data.captions import read_captions

    cf = read_captions(data, images, on_error=on_error)
    n = len(cf.images)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=g).tolist()
    n_valid_images, n_test_images = round(n * valid), round(n * test)
    parts = {"test": perm[:n_test_images], "valid": perm[n_test_images:n_test_images + n_valid_images],
             "train": perm[n_test_images + n_valid_images:]}
    if not all(parts.values()):
        raise ValueError(f"{data}: {n} images with captions make {len(parts['train'])} train, "
                         f"{len(parts['valid'])} valid and {len(parts['test'])} test images; every split needs one "
                         "(more images, or larger --valid/--test shares)")
    splits = {name: CaptionSplit([cf.images[i] for i in idx], [cf.captions[i] for i in idx], None, image_size, grey)
              for name, idx in parts.items()}
    return CaptionData(splits, image_size, 1 if grey else 3, [])


# ----------------------------------------------------------------------------------------------- decoding

@dataclass
class Caption:
    """One caption: its ``text`` and ``words``, ``attention (len(words), h, w)`` (the map each word was produced
    with) and the beam ``score`` (log-probability)."""

    text: str
    words: list[str]
    attention: Tensor
    score: float


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
            for start in range(0, len(images), batch_size):
                x = images[start:start + batch_size]
                x = (x.float() / 255.0 if x.dtype == torch.uint8 else x.float()).to(device)
                for hyp in beam_search(model, x, beam=beam, max_len=max_len, length_penalty=length_penalty):
                    words = tokenizer.tokens_of_ids(hyp.tokens)
                    out.append(Caption(tokenizer.decode(hyp.tokens), words,
                                       hyp.attention[:len(words)].reshape(len(words), h, w), hyp.score))
    finally:
        model.train(was_training)
    return out


# ----------------------------------------------------------------------------------------------- metrics

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
