"""A trained image run read back: :class:`ImageClassifier` (``load`` / ``predict`` / ``evaluate`` / ``view``, and
``attention`` for ``qkv show-attention``) and its result, :class:`ImagePrediction`."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ...data.images import IMAGE_DATASETS, ImageData, normalize
from ..base import Accepts, ImagePredictor, PageInput, check_index, jsonable, upgrade_options
from .maps import AttentionView, attention_view
from .options import ImageOptions, ImageSettings
from .task import ImageTask, load_data, predict_logits

__all__ = ["ImagePrediction", "ImageClassifier"]


@dataclass
class ImagePrediction:
    """One classified image: the ``label``, its ``probability`` and every class's ``probabilities``."""

    label: str
    probability: float
    probabilities: dict[str, float]


class ImageClassifier(ImagePredictor):
    """A trained image run: ``ImageClassifier.load(run_dir).predict(images)``; :meth:`attention` gives the maps
    of ``qkv show-attention``, :meth:`view` every attention for ``qkv view``."""

    task_class = ImageTask
    settings = ImageSettings
    #: an image file of any size is resized to the trained size (a tensor must have it)
    accepts = Accepts(min_image=1)

    def __init__(self, model: nn.Module, options: ImageOptions, config: Mapping[str, Any]):
        super().__init__(model, options, config)
        self.image_size = tuple(config["image_size"])
        self.mean, self.std = float(config["mean"]), float(config["std"])
        self.class_names = list(config["class_names"])

    def read(self, path: str | os.PathLike, *, invert: bool = False) -> Tensor:
        """An image file as this model's input: grey ``(H, W)`` in [0, 1] at the trained size."""
        from ...data.images import read_image

        return read_image(path, self.image_size, invert=invert)

    def options_for(self, data: str | None) -> ImageOptions:
        """The run's options reading ``data`` instead: ``None`` (the run's own data), a data set name
        (``fashion-mnist``, ``digits``; its default folder) or a folder of MNIST-style IDX files (read as the run's
        kind of data; ``mnist`` for a digits run)."""
        if not data:
            return self.options
        values = dataclasses.asdict(self.options)
        if data in IMAGE_DATASETS:
            values.update(data=data, data_root=None)
        elif Path(data).is_dir():
            values.update(data="mnist" if self.options.data == "digits" else self.options.data, data_root=str(data))
        else:
            raise ValueError(f"{data}: neither a folder of IDX files nor one of {', '.join(IMAGE_DATASETS)}")
        return upgrade_options(ImageOptions, values)

    def read_data(self, data: str | None) -> ImageData:
        """The splits of the run's data (or of ``data``, see :meth:`options_for`); their images must have the
        trained size and their labels the trained classes."""
        d = load_data(self.options_for(data))
        if d.image_size != self.image_size:
            raise ValueError(f"{data}: its images are {d.image_size[0]}x{d.image_size[1]}, the model's "
                             f"{self.image_size[0]}x{self.image_size[1]}")
        most = max(int(labels.max()) for _, labels in d.splits.values() if len(labels))
        if most >= len(self.class_names):
            raise ValueError(f"{data}: label {most} but the model knows {len(self.class_names)} classes")
        return d

    def test_images(self, data_root: str | None = None) -> tuple[Tensor, Tensor]:
        """The test split the run was evaluated on (``(N, H, W)`` uint8, labels), optionally from another folder."""
        return self.dataset(data_root).splits["test"]

    def _pictures(self, images: Tensor | Sequence[Any], invert: bool) -> Tensor:
        if not isinstance(images, Tensor):
            if isinstance(images, str | os.PathLike):
                raise ValueError("images must be a batch: a list of files or (H, W) tensors, or an (N, H, W) tensor")
            items = [self.read(x, invert=invert) if isinstance(x, str | os.PathLike)
                     else x.float() / 255.0 if isinstance(x, Tensor) and x.dtype == torch.uint8 else x
                     for x in images]
            for i, x in enumerate(items):
                if not isinstance(x, Tensor) or tuple(x.shape) != self.image_size:
                    what = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
                    raise ValueError(f"image {i + 1} must be a file or an ({self.image_size[0]}, "
                                     f"{self.image_size[1]}) tensor, got {what}")
            images = torch.stack(items) if items else torch.empty(0, *self.image_size)
        if images.dim() != 3 or tuple(images.shape[-2:]) != self.image_size:
            raise ValueError(f"images must be (N, {self.image_size[0]}, {self.image_size[1]}), got "
                             f"{tuple(images.shape)}")
        if not len(images):
            raise ValueError("no images to classify")
        return images

    def _inputs(self, images: Tensor) -> Tensor:
        return normalize(images, self.mean, self.std).to(self.device)

    def predict(self, images: Tensor | Sequence[Any], *, invert: bool = False) -> list[ImagePrediction]:
        """Class probabilities of a batch of images: a tensor ``(N, H, W)`` (uint8, or float in [0, 1]) or a list
        of image files (read grey at the trained size; ``invert`` for dark objects on a light background) and
        ``(H, W)`` tensors."""
        self.check_settings({"invert": invert}, "predict")
        probs = predict_logits(self.model, self._inputs(self._pictures(images, invert)),
                               self.options.eval_batch).softmax(-1)
        out = []
        for p in probs:
            k = int(p.argmax())
            out.append(ImagePrediction(self.class_names[k], float(p[k]),
                                       {n: float(v) for n, v in zip(self.class_names, p, strict=True)}))
        return out

    def result_row(self, result: ImagePrediction) -> dict[str, Any]:
        """``output`` (the label and its probability), the ``label``, its ``probability`` and every class's."""
        return jsonable({"output": f"{result.label} {result.probability:.3f}", "label": result.label,
                         "probability": result.probability, "probabilities": result.probabilities})

    def attention(self, images: Tensor | Sequence[Any], *, invert: bool = False) -> AttentionView:
        """The probabilities and attention maps of a batch (as :meth:`predict` takes it); a ``ValueError`` for a
        model without."""
        view = attention_view(self.model, self._inputs(self._pictures(images, invert)))
        if view.empty:
            raise ValueError("this model has no attention maps to show (it was trained with attn none)")
        return view

    def evaluate(self, data: str | None = None, *, split: str = "test", limit: int | None = None,
                 **settings: Any) -> dict[str, float]:
        """Accuracy and (unsmoothed) loss on the first ``limit`` images of ``split`` (``valid`` or ``test``) of the
        run's data, or of ``data`` (see :meth:`options_for`: another IDX folder or a data set name), as the
        trainer evaluated them (the run's ``tta`` included); ``examples``: how many images."""
        self.check_settings(settings)
        if split not in ("valid", "test"):
            raise ValueError(f"no split {split!r}; one of valid, test")
        d = self.dataset(data)
        images, labels = d.splits[split]
        task = ImageTask(self.options_for(data), ImageData({**d.splits, split: (images[:limit], labels[:limit])},
                                                           d.class_names))
        task.mean, task.std = self.mean, self.std  # the run's normalisation, not the new data's
        metrics = task.evaluate(self.model, split)
        return {**metrics, "examples": float(len(labels[:limit]))}

    def test_image(self, index: int) -> Tensor:
        """Image ``index`` of the run's test split, ``(H, W)`` in [0, 1] as :meth:`read` gives a file."""
        test = self.test_images()[0]
        return test[check_index(index, len(test))].float() / 255

    def view_page(self, records: list, x: Tensor, pred: ImagePrediction) -> PageInput:
        """The image's page: its attention maps, the predicted label as its title."""
        return PageInput(records, None, x, title=f"{pred.label} ({pred.probability:.2f})",
                         notes=[f"{self.options.arch} with attention {self.options.attn}"])
