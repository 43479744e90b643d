"""Image classification with channel and spatial attention: the options, data, model, the trainer's task and an
:class:`ImageClassifier` that predicts, evaluates and returns the attention maps.

Data (grey images; :func:`qkv.data.images.load_image_splits`): ``fashion-mnist`` (Debian's
``dataset-fashion-mnist`` or any folder of its IDX files), ``mnist`` (any MNIST-style IDX folder) and ``digits``
(scikit-learn's 8x8 digits upsampled to 16x16, for tiny tests). Augmentation (``augment="auto"``): flips for
Fashion-MNIST (clothes are left-right symmetric; two 6-epoch runs with 2-pixel shifts as well tested 0.6 and 1.3
points lower, see BENCHMARKS.md), shifts for MNIST, none for digits. Pixels are normalised by the training split's
mean and standard deviation, which the run keeps.

Models: ``small-cnn`` (:class:`qkv.models.SmallCNN`, made for 28x28) and ``resnet18/34/50/101`` with one input
channel and, by default, the CIFAR stem (``stem="cifar"``: a 3x3 stride-1 convolution and no max-pool, as the
ResNet paper does for CIFAR-10, so a 28x28 image keeps 28x28 features in the first stage). ``attn`` takes any
:mod:`qkv.vision` block name; each block goes where its paper puts it.

Its parts under the contract of :mod:`qkv.apps.base`: :class:`ImageTask` (the trainer's task),
:class:`ImageClassifier` (a run read back: ``predict``, ``evaluate``, ``view``, ``result_row``; command-line inputs
are image files) and :meth:`~qkv.apps.images.task.ImageTask.evaluate`, the one metric both evaluate with.

Example::

    from qkv.apps.images import ImageClassifier, ImageOptions, ImageTask, train_defaults
    from qkv.train import train
    options = ImageOptions(data="fashion-mnist", arch="small-cnn", attn="cbam")
    train(ImageTask(options), train_defaults(options).replace(max_minutes=10, out="runs/fm-cbam"))
    clf = ImageClassifier.load("runs/fm-cbam")
    clf.predict(["shirt.png"], invert=True)[0].label    # files, or an (N, H, W) tensor
    clf.evaluate(limit=1000)                           # {'accuracy': ..., 'loss': ..., 'examples': 1000.0}
"""

from __future__ import annotations

from ..base import Application
from . import command, export
from .maps import AttentionView, attention_view
from .options import ARCHS, AUGMENTATIONS, ImageOptions, parse_attn_args, train_defaults
from .predictor import ImageClassifier, ImagePrediction
from .task import ImageTask, count_parameters, load_data, model_spec, predict_logits

__all__ = ["APPLICATION", "ImageOptions", "load_data", "model_spec", "train_defaults", "ImageTask",
           "ImagePrediction", "ImageClassifier", "AttentionView", "attention_view", "predict_logits",
           "count_parameters", "parse_attn_args", "ARCHS", "AUGMENTATIONS"]


APPLICATION = Application(
    name="images", commands=command.COMMANDS,
    train_defaults=train_defaults, task=ImageTask, predictor=ImageClassifier, export=export.graphs)
