"""Semantic segmentation with BiSeNet V1's attention refinement and feature fusion: the options, data, models, the
trainer's task and a :class:`Segmenter` that predicts label maps, evaluates (mIoU, per-class IoU, pixel accuracy)
and returns each image's ARM/FFM channel weights.

Data (:mod:`qkv.apps.segment.scenes`): ``scenes`` (Fashion-MNIST items of 12-32 pixels in the cells of a 64x64 grey
canvas, each item's pixels labelled its class + 1 over background 0, some (item, cell) combinations only in the test
split) or a folder of images with index-coloured label PNGs (``images/`` + ``labels/``, or VOC's ``JPEGImages/`` +
``SegmentationClass/``), with an ignore label (255).

Models (:mod:`qkv.models.bisenet`): ``bisenet`` with its ablations ``arm=False``, ``ffm=False`` and
``context_only=True``, and ``fcn`` (FCN-8s on the same ResNet-18-style backbone). ``widths``, ``spatial_widths`` and
``dim`` make a tiny network.

Its parts under the contract of :mod:`qkv.apps.base`: :class:`SegmentTask` (the trainer's task), :class:`Segmenter`
(a run read back: ``predict``, ``evaluate``, ``view``, ``result_row``; command-line inputs are image files) and
:func:`score`, the one metric both evaluate with.

Example::

    from qkv.apps.segment import SegmentOptions, SegmentTask, Segmenter, train_defaults
    from qkv.train import train
    options = SegmentOptions(data="scenes", model="bisenet", widths=(16, 32, 64, 128), spatial_widths=(16, 16, 32),
                             dim=32, head_dim=32)
    train(SegmentTask(options), train_defaults(options).replace(max_minutes=5, out="runs/segment"))
    seg = Segmenter.load("runs/segment")
    seg.predict(["scene.png"])[0].labels          # (H, W) class numbers; .attention: ARM/FFM channel weights
    seg.evaluate()                                 # {'miou': ..., 'pixel_accuracy': ..., 'iou/bag': ..., ...}
"""

from __future__ import annotations

from ..base import Application
from . import command, export
from .options import MODELS, SegmentOptions, train_defaults
from .predictor import Segmentation, Segmenter
from .task import SegmentTask, load_data, model_spec, normalize, predict_logits, score

__all__ = ["APPLICATION", "SegmentOptions", "train_defaults", "MODELS", "load_data", "model_spec",
           "SegmentTask", "Segmenter", "Segmentation", "normalize", "predict_logits", "score"]


APPLICATION = Application(
    name="segment", commands=command.COMMANDS,
    train_defaults=train_defaults, task=SegmentTask, predictor=Segmenter, export=export.graphs)
