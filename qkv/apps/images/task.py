"""Image classification's data, model and the trainer's task: :func:`load_data`, :func:`model_spec`,
:class:`ImageTask`, and :func:`predict_logits` (batched inference)."""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...data.images import ImageData, ImageExamples, load_image_splits, normalize, random_shift_flip
from ...train.threads import batch_starts
from ..base import ApplicationTask
from .options import ImageOptions
from .upgrade import upgrade_config

logger = logging.getLogger(__name__)

__all__ = ["load_data", "model_spec", "ImageTask", "predict_logits", "count_parameters"]


def load_data(options: ImageOptions) -> ImageData:
    """The ``train``, ``valid`` and ``test`` splits ``options`` describe (deterministic in ``data_seed``)."""
    return load_image_splits(options.data, root=options.data_root, valid=options.valid, test=options.test,
                             seed=options.data_seed)


def model_spec(options: ImageOptions, *, num_classes: int, in_channels: int = 1) -> dict[str, Any]:
    """``{"name", "config"}`` for :func:`qkv.models.create`."""
    o = options
    config: dict[str, Any] = {"num_classes": num_classes, "in_channels": in_channels,
                              "attn": None if o.attn == "none" else o.attn, "attn_kwargs": dict(o.attn_kwargs) or None}
    if o.arch == "small-cnn":
        config.update(widths=list(o.widths), dropout=o.dropout)
    else:
        config["stem"] = o.stem
    return {"name": o.arch, "config": config}


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def predict_logits(model: nn.Module, x: Tensor, batch_size: int = 500) -> Tensor:
    """Logits of ``x (N, C, H, W)`` in batches, on the model's device; returned on the CPU as float32."""
    device = next(model.parameters()).device
    with torch.no_grad():
        out = [model(x[i:i + batch_size].to(device)).float().cpu()
               for i in batch_starts(len(x), batch_size, device=device)]
    return torch.cat(out) if out else torch.empty(0)


class ImageTask(ApplicationTask, name="images", unit="images", options=ImageOptions, load_data=load_data,
                model_spec=model_spec, upgrade=upgrade_config):
    """Image classification with label-smoothed cross-entropy; metrics: accuracy and (unsmoothed) loss.

    ``data`` (an :class:`~qkv.data.images.ImageData`) may be given to skip reading ``options.data``.
    """

    def __init__(self, options: ImageOptions, data: ImageData | None = None):
        super().__init__(options, data)
        self.mean = self.std = None

    def setup(self) -> None:
        x = self.read_data().splits["train"][0].float() / 255.0
        self.mean, self.std = float(x.mean()), float(x.std().clamp_min(1e-6))

    def train_examples(self):
        return ImageExamples(*self.data.splits["train"])

    def collate(self, examples):
        images = torch.stack([x for x, _ in examples])
        labels = torch.tensor([y for _, y in examples], dtype=torch.long)
        aug = self.options.augmentation
        if aug != "none":
            shift = self.options.shift if aug in ("shift", "shift-flip") else 0
            images = random_shift_flip(images, shift, flip=aug in ("flip", "shift-flip"))
        return self._layout(normalize(images, self.mean, self.std)), labels

    def _layout(self, x: Tensor) -> Tensor:
        return x.contiguous(memory_format=torch.channels_last) if self.options.channels_last else x

    def run_config(self) -> dict[str, Any]:
        return {"image_size": list(self.data.image_size), "mean": self.mean, "std": self.std,
                "class_names": self.data.class_names}

    def sizes(self) -> dict[str, Any]:
        return {"num_classes": len(self.data.class_names)}

    def build_model(self) -> nn.Module:
        model = super().build_model()
        logger.info("%s with attention %s: %s parameters", self.options.arch, self.options.attn,
                    f"{count_parameters(model):,}")
        return model.to(memory_format=torch.channels_last) if self.options.channels_last else model

    def loss(self, model, batch):
        x, y = batch
        logits = model(x)
        loss = F.cross_entropy(logits.float(), y, reduction="sum", label_smoothing=self.options.label_smoothing)
        return loss, len(y), {"correct": (logits.argmax(-1) == y).sum()}

    def evaluate(self, model, split: str) -> dict[str, float]:
        """Accuracy and loss on ``split``; with ``tta="flip"``, of the mean probabilities of each image and its
        left-right mirror (the loss is then the NLL of those mean probabilities)."""
        from ...metrics import classification_metrics

        if split not in self.data.splits or split == "train":
            raise ValueError(f"no split {split!r}; one of valid, test")
        images, labels = self.data.splits[split]
        x = self._layout(normalize(images, self.mean, self.std))
        logits = predict_logits(model, x, self.options.eval_batch)
        if self.options.tta == "flip":
            mirrored = predict_logits(model, x.flip(-1), self.options.eval_batch)
            probs = (logits.softmax(-1) + mirrored.softmax(-1)) / 2
            logits = probs.clamp_min(torch.finfo(probs.dtype).tiny).log()  # log-probabilities: CE = NLL of probs
        return classification_metrics(logits, labels)
