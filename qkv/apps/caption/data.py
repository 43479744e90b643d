"""The captioning task's data: its splits (:class:`CaptionSplit`, :class:`CaptionData`), the trainer's examples and
:func:`load_caption_data`. Decoding and the metrics are in :mod:`qkv.apps.caption.decode`."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

logger = logging.getLogger(__name__)

__all__ = ["CaptionSplit", "CaptionData", "CaptionExamples", "load_caption_data"]


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
        from .captions import load_image

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
    from .captions import read_captions

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
                         "(more images, or larger valid/test shares)")
    splits = {name: CaptionSplit([cf.images[i] for i in idx], [cf.captions[i] for i in idx], None, image_size, grey)
              for name, idx in parts.items()}
    return CaptionData(splits, image_size, 1 if grey else 3, [])
