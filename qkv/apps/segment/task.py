"""Segmentation's data, model, metric and the trainer's task: :func:`load_data`, :func:`model_spec`, :func:`score`
(the metrics, for the trainer and the predictor alike), :class:`SegmentTask` and :func:`predict_logits`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...train.threads import batch_starts
from ..base import ApplicationTask
from .options import SegmentOptions
from .scenes import SegmentationData, SegmentationSplit, make_segmentation_scenes, read_segmentation_folder

logger = logging.getLogger(__name__)

__all__ = ["load_data", "model_spec", "SegmentTask", "predict_logits", "normalize", "score"]


def load_data(options: SegmentOptions) -> SegmentationData:
    """The ``train``, ``valid`` and ``test`` splits ``options`` describe (generated scenes or a folder)."""
    o = options
    if o.data == "scenes":
        return make_segmentation_scenes(o.n_train, o.n_valid, o.n_test, seed=o.data_seed, root=o.scenes_root,
                                        ignore_index=o.ignore_index)
    return read_segmentation_folder(o.data, image_size=o.image_size, grey=o.grey, valid=o.valid, test=o.test,
                                    seed=o.data_seed, num_classes=o.num_classes, ignore_index=o.ignore_index,
                                    on_error=o.on_error)


def model_spec(options: SegmentOptions, *, num_classes: int, in_channels: int) -> dict[str, Any]:
    """``{"name", "config"}`` for :func:`qkv.models.create`."""
    o = options
    config: dict[str, Any] = {"num_classes": num_classes, "in_channels": in_channels, "widths": list(o.widths),
                              "blocks": list(o.blocks), "head_dim": o.head_dim, "padding": o.padding_mode}
    if o.model == "bisenet":
        config.update(spatial_widths=list(o.spatial_widths), dim=o.dim, arm=o.arm, ffm=o.ffm,
                      spatial=not o.context_only, aux=o.aux_weight > 0)
    return {"name": o.model, "config": config}


def normalize(images: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """``images (B, C, H, W)`` uint8 -> float ``(x / 255 - mean_c) / std_c``."""
    m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    x = images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
    return (x - m) / s


def predict_logits(model: nn.Module, x: Tensor) -> Tensor:
    """Logits ``(N, K, H, W)`` of normalised ``x (N, C, H, W)``, on the model's device; returned on the CPU."""
    device = next(model.parameters()).device
    with torch.no_grad():
        return model(x.to(device)).float().cpu()


def score(model: nn.Module, split: SegmentationSplit, *, mean: Sequence[float], std: Sequence[float],
          class_names: Sequence[str], ignore_index: int, batch_size: int = 64) -> dict[str, float]:
    """mIoU, pixel accuracy, per-class IoU (``iou/NAME``) and the loss of ``model`` on ``split``, in batches; for
    scenes, also ``miou_held_out``: the mIoU of the scenes that hold a held-out (item, cell) combination."""
    from ...metrics import confusion_matrix, segmentation_metrics

    k = len(class_names)
    total, held = torch.zeros(k, k, dtype=torch.long), torch.zeros(k, k, dtype=torch.long)
    loss, counted = 0.0, 0
    device = next(model.parameters()).device
    for i in batch_starts(len(split), batch_size, device=device):
        logits = predict_logits(model, normalize(split.images[i:i + batch_size], mean, std))
        target = split.labels[i:i + batch_size].long()
        pred = logits.argmax(1)
        total += confusion_matrix(pred, target, k, ignore_index=ignore_index)
        if split.held_out is not None and bool(split.held_out[i:i + batch_size].any()):
            h = split.held_out[i:i + batch_size]
            held += confusion_matrix(pred[h], target[h], k, ignore_index=ignore_index)
        n = int((target != ignore_index).sum())
        if n:
            loss += float(F.cross_entropy(logits.double(), target, ignore_index=ignore_index, reduction="sum"))
            counted += n
    out = segmentation_metrics(total, class_names)
    out["loss"] = loss / counted if counted else float("nan")
    if split.held_out is not None and bool(split.held_out.any()):
        out["miou_held_out"] = segmentation_metrics(held, class_names)["miou"]
    return out


class SegmentExamples:
    """Indexable ``(image (C, H, W) uint8, labels (H, W) uint8)`` pairs, for the trainer."""

    def __init__(self, split: SegmentationSplit):
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return self.split.images[i], self.split.labels[i]


class SegmentTask(ApplicationTask, name="segment", unit="pixels", options=SegmentOptions, load_data=load_data,
                  model_spec=model_spec):
    """Semantic segmentation: per-pixel cross-entropy (the ignore label left out) plus, for BiSeNet,
    ``aux_weight`` times its two auxiliary heads' losses; metrics: mIoU, per-class IoU, pixel accuracy, loss.

    ``data`` (a :class:`~qkv.apps.segment.scenes.SegmentationData`) may be given to skip reading ``options.data``.
    The unit, ``pixels``, is what the loss counts: the scored (not ignored) pixels.
    """

    def __init__(self, options: SegmentOptions, data: SegmentationData | None = None):
        super().__init__(options, data)
        self.mean: list[float] | None = None
        self.std: list[float] | None = None

    def setup(self) -> None:
        x = self.read_data().splits["train"].images.float() / 255.0
        self.mean = [float(v) for v in x.mean(dim=(0, 2, 3))]
        self.std = [float(v) for v in x.std(dim=(0, 2, 3)).clamp_min(1e-6)]

    def train_examples(self):
        return SegmentExamples(self.data.splits["train"])

    def collate(self, examples):
        images = torch.stack([x for x, _ in examples])
        labels = torch.stack([y for _, y in examples]).long()
        if self.options.flip and self.options.data != "scenes":
            mirror = torch.rand(len(images)) < 0.5
            images = torch.where(mirror[:, None, None, None], images.flip(-1), images)
            labels = torch.where(mirror[:, None, None], labels.flip(-1), labels)
        return normalize(images, self.mean, self.std), labels

    def sizes(self) -> dict[str, Any]:
        return {"num_classes": len(self.data.class_names), "in_channels": self.data.channels}

    def run_config(self) -> dict[str, Any]:
        return {"mean": self.mean, "std": self.std, "class_names": self.data.class_names,
                "ignore_index": self.data.ignore_index,
                "image_size": list(self.data.splits["train"].images.shape[-2:])}

    def build_model(self) -> nn.Module:
        model = super().build_model()
        logger.info("%s: %s parameters", self.options.variant, f"{sum(p.numel() for p in model.parameters()):,}")
        return model

    def loss(self, model, batch):
        x, y = batch
        ignore = self.options.ignore_index
        logits, aux = model(x, return_aux=True)
        loss = F.cross_entropy(logits.float(), y, ignore_index=ignore, reduction="sum")
        for extra in aux:
            loss = loss + self.options.aux_weight * F.cross_entropy(extra.float(), y, ignore_index=ignore,
                                                                    reduction="sum")
        counted = y != ignore
        correct = ((logits.argmax(1) == y) & counted).sum()
        return loss, counted.sum(), {"correct": correct}

    def evaluate(self, model, split: str) -> dict[str, float]:
        if split not in ("valid", "test"):
            raise ValueError(f"no split {split!r}; one of valid, test")
        return score(model, self.data.splits[split], mean=self.mean, std=self.std,
                     class_names=self.data.class_names, ignore_index=self.data.ignore_index,
                     batch_size=self.options.eval_batch)
