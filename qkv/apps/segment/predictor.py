"""A trained segmentation run read back: :class:`Segmenter` (``load`` / ``predict`` / ``evaluate`` / ``view``) and its
result, :class:`Segmentation` (the label map and the ARM/FFM channel weights of that image)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ...train.threads import follow_threads
from ..base import Accepts, ImagePredictor, PageInput, ViewInput, check_index, jsonable, upgrade_options
from .options import SegmentOptions, SegmentSettings
from .scenes import SegmentationData
from .task import SegmentTask, load_data, normalize, score

__all__ = ["Segmentation", "Segmenter"]


@dataclass
class Segmentation:
    """One segmented image: ``labels (H, W)`` (class numbers), ``confidence (H, W)`` (the chosen class's
    probability), the class names, and ``attention``: each ARM's and the FFM's channel weights ``(C,)`` for this
    image (``{"arm16", "arm32", "ffm"}``, the blocks the model has)."""

    labels: Tensor
    confidence: Tensor
    class_names: list[str]
    attention: dict[str, Tensor]

    def shares(self) -> dict[str, float]:
        """The share of the image's pixels given to each class that has any."""
        counts = torch.bincount(self.labels.flatten(), minlength=len(self.class_names))
        return {n: float(c) / self.labels.numel() for n, c in zip(self.class_names, counts, strict=True) if c}


class Segmenter(ImagePredictor):
    """A trained segmentation run: ``Segmenter.load(run_dir).predict(images)``; :meth:`view` gives the ARM/FFM
    channel attention of one image for ``qkv view``."""

    task_class = SegmentTask
    settings = SegmentSettings
    #: a circularly padded model's (scenes): see :func:`smallest_side`; a run's own is set when it is loaded
    accepts = Accepts(min_image=3)

    def __init__(self, model: nn.Module, options: SegmentOptions, config: Mapping[str, Any]):
        super().__init__(model, options, config)
        self.accepts = Accepts(min_image=smallest_side(model))
        self.mean, self.std = list(config["mean"]), list(config["std"])
        self.class_names = list(config["class_names"])
        self.ignore_index = int(config["ignore_index"])
        self.channels = len(self.mean)

    def read(self, path: str | os.PathLike) -> Tensor:
        """An image file as this model's input: ``(C, H, W)`` uint8 at its own size (grey for a grey model)."""
        from PIL import Image

        from ...data.images import image_8bit

        path = Path(path)
        if not path.is_file():
            raise ValueError(f"no image file {str(path)!r}")
        try:
            with Image.open(path) as im:
                a = np.array(image_8bit(im, grey=self.channels == 1, name=str(path)))
        except Exception as e:  # any decoder error means the same to the user
            raise ValueError(f"cannot read image {str(path)!r}: {e}") from None
        self.check_input("image", a.shape[:2], str(path))
        x = torch.from_numpy(a)
        return x[None] if x.dim() == 2 else x.permute(2, 0, 1).contiguous()

    def _picture(self, image: Any, i: int) -> Tensor:
        x = self.read(image) if isinstance(image, str | os.PathLike) else image
        if not isinstance(x, Tensor):
            raise ValueError(f"image {i + 1} must be a file or a (C, H, W) / (H, W) tensor, got {type(x).__name__}")
        if x.dim() == 2:
            x = x[None]
        if x.dim() != 3 or x.shape[0] != self.channels or min(x.shape[-2:]) < 1:
            raise ValueError(f"image {i + 1} must be ({self.channels}, H, W) for this model, got {tuple(x.shape)}")
        self.check_input("image", tuple(x.shape[-2:]), f"image {i + 1}")
        if x.dtype != torch.uint8:  # floats in [0, 1]
            x = (x.float().clamp(0, 1) * 255).round().to(torch.uint8)
        return x

    def predict(self, images: Sequence[Any]) -> list[Segmentation]:
        """The label map of every image: files (read at their own size) or ``(C, H, W)`` / ``(H, W)`` tensors
        (uint8, or floats in [0, 1]); each image runs alone, any size."""
        if isinstance(images, str | os.PathLike) or (isinstance(images, Tensor) and images.dim() < 3):
            raise ValueError("images must be a batch: a list of files or tensors, or an (N, C, H, W) tensor")
        pictures = [self._picture(x, i) for i, x in enumerate(images)]
        if not pictures:
            raise ValueError("no images to segment")
        out = []
        for x in follow_threads(pictures, lambda x: x.shape[-2] * x.shape[-1], device=self.device):
            with torch.no_grad():
                logits, _, maps = self.model(normalize(x[None], self.mean, self.std).to(self.device),
                                             return_aux=True, return_attention=True)
            probs = logits[0].float().softmax(0).cpu()
            confidence, labels = probs.max(0)
            out.append(Segmentation(labels, confidence, self.class_names,
                                    {k: v[0].flatten().float().cpu() for k, v in maps.items()}))
        return out

    def result_row(self, result: Segmentation) -> dict[str, Any]:
        """``output`` (the classes the image holds, most pixels first), each one's ``shares`` of the pixels, the
        ``size`` ``[H, W]`` and the mean ``confidence``."""
        shares = dict(sorted(result.shares().items(), key=lambda kv: -kv[1]))
        return jsonable({"output": ", ".join(f"{n} {v:.0%}" for n, v in shares.items()), "shares": shares,
                         "size": list(result.labels.shape), "confidence": float(result.confidence.mean())})

    def options_for(self, data: str | None) -> SegmentOptions:
        """The run's options reading ``data`` instead: ``None`` (its own), ``scenes`` or a folder."""
        if not data or data == self.options.data:
            return self.options
        values = dataclasses.asdict(self.options)
        values["data"] = data
        if data != "scenes" and not Path(data).is_dir():
            raise ValueError(f"{data}: neither 'scenes' nor a folder of images and label PNGs")
        if data != "scenes":
            values["num_classes"] = len(self.class_names)
        return upgrade_options(SegmentOptions, values)

    def read_data(self, data: str | None) -> SegmentationData:
        """The splits of the run's data (or of ``data``); their classes must be the model's."""
        options = self.options_for(data)
        if options.data == "scenes":  # valid and test scenes do not depend on the training ones: make one
            options = dataclasses.replace(options, n_train=1)
        d = load_data(options)
        if len(d.class_names) != len(self.class_names) or d.channels != self.channels:
            raise ValueError(f"{data}: {len(d.class_names)} classes and {d.channels}-channel images, the model "
                             f"{len(self.class_names)} and {self.channels}")
        return d

    def evaluate(self, data: str | None = None, *, split: str = "test", limit: int | None = None,
                 **settings: Any) -> dict[str, float]:
        """mIoU, pixel accuracy, per-class IoU (``iou/NAME``) and loss on the first ``limit`` images of ``split``
        (``valid`` or ``test``) of the run's data or of ``data`` (``scenes`` or a folder); ``examples``: how many;
        ``miou_held_out`` on scenes."""
        self.check_settings(settings)
        if split not in ("valid", "test"):
            raise ValueError(f"no split {split!r}; one of valid, test")
        part = self.dataset(data).splits[split].head(limit)
        metrics = score(self.model, part, mean=self.mean, std=self.std, class_names=self.class_names,
                        ignore_index=self.ignore_index, batch_size=self.options.eval_batch)
        return {**metrics, "examples": float(len(part))}

    def test_image(self, index: int) -> Tensor:
        """Image ``index`` of the run's test split, ``(C, H, W)`` uint8."""
        test = self.dataset().splits["test"]
        return test.images[check_index(index, len(test))]

    def view_input(self, given: ViewInput) -> Tensor:
        """One image (``given.image`` or ``given.index``), checked as :meth:`predict` checks it."""
        return self._picture(super().view_input(given), 0)

    def view_page(self, records: list, x: Tensor, seg: Segmentation) -> PageInput:
        """The ARM and FFM channel weights of the model segmenting the image; the largest classes as its title."""
        shares = ", ".join(f"{n} {v:.0%}" for n, v in sorted(seg.shares().items(), key=lambda kv: -kv[1])[:4])
        notes = [f"{self.options.variant}: {', '.join(seg.attention) or 'no'} channel attention"]
        return PageInput(records, None, x.float().mean(0) / 255, title=f"segmented: {shares}", notes=notes)


def smallest_side(model: nn.Module) -> int:
    """The smallest image side ``model`` reads: circular padding (scenes) wraps around at most once, so an image
    must be at least as wide as the widest circular padding, the stem's (3 pixels of its 7x7 convolution, on the
    image itself); the 3x3 convolutions' 1 pixel fits any later map, which has at least one. Zero padding reads an
    image of a pixel."""
    pads = [p for m in model.modules() if isinstance(m, nn.Conv2d) and m.padding_mode == "circular"
            for p in m.padding]
    return max([1, *pads])
