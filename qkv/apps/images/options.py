"""Image classification's options (:class:`ImageOptions`) and the trainer's preset (:func:`train_defaults`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ...data.images import IMAGE_DATASETS
from ...options import OptionError, check_options, option, ref

__all__ = ["ImageOptions", "ImageSettings", "train_defaults", "parse_attn_args", "ARCHS", "AUGMENTATIONS"]

ARCHS = ("small-cnn", "resnet18", "resnet34", "resnet50", "resnet101")
AUGMENTATIONS = ("auto", "none", "flip", "shift", "shift-flip")
_RESNETS = {"arch": ARCHS[1:]}


def parse_attn_args(items: list[str] | str) -> dict[str, Any]:
    """``["reduction=8", "mode=dot"]`` -> ``{"reduction": 8, "mode": "dot"}`` (values read as JSON when they can be)."""
    out: dict[str, Any] = {}
    for item in [items] if isinstance(items, str) else items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"attention arguments are KEY=VALUE (e.g. reduction=8), got {item!r}")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


@dataclass
class ImageOptions:
    """What to train on and which model; the trainer's settings are in :class:`qkv.train.TrainConfig`."""

    # data
    data: str = option("fashion-mnist", choices=IMAGE_DATASETS,
                       help="fashion-mnist, mnist (an MNIST-style IDX folder) or scikit-learn's digits")
    data_root: str | None = option(None, excludes={"data": ("digits",)},
                                   help="folder of the IDX files (fashion-mnist: /usr/share/datasets/fashion-mnist)")
    valid: float = option(0.1, low=0, low_open=True, high=0.9, help="fraction of the training images for validation")
    test: float = option(0.2, low=0, low_open=True, high=0.9, applies={"data": ("digits",)},
                         help="digits: fraction of the images held out for the test")
    data_seed: int = option(0, low=0, help="seed of the held-out splits (not of training)")
    augment: str = option("auto", choices=AUGMENTATIONS,
                          help="auto: flips for fashion-mnist, shifts for mnist, none for digits")
    shift: int = option(2, low=0, excludes={"augment": ("none", "flip")}, help="largest random shift (pixels)")
    # model
    arch: str = option("small-cnn", choices=ARCHS, help="small-cnn or a ResNet")
    attn: str = option("none", help="none, or a qkv.vision block: se, eca, cbam, cbam_channel, cbam_spatial, sk, "
                       "non_local, arm")
    attn_kwargs: dict[str, Any] = option(default_factory=dict, flag="--attn-arg", metavar="KEY=VALUE", repeat=True,
                                         parse=parse_attn_args, help="argument of every attention block, e.g. "
                                         "reduction=8 or mode=dot (repeatable)")
    widths: tuple[int, ...] = option((32, 64, 128), low=1, applies={"arch": ("small-cnn",)},
                                     help="small-cnn: channels of its three stages")
    dropout: float = option(0.1, low=0, high=0.99, applies={"arch": ("small-cnn",)},
                            help="small-cnn: dropout before the classifier")
    stem: str = option("cifar", choices=("cifar", "imagenet"), applies=_RESNETS,
                       help="resnets: cifar (3x3 stride 1, no max-pool, for 28x28) or the original imagenet stem")
    label_smoothing: float = option(0.1, low=0, high=0.99, help="label smoothing of the cross-entropy")
    eval_batch: int = option(500, low=1, help="images per forward pass in evaluation")
    channels_last: bool = option(True, help="channels-last memory format (faster oneDNN/cuDNN convolutions)")
    tta: str = option("none", choices=("none", "flip"),
                      help="test-time augmentation: flip averages each image's probabilities with its mirror's")

    def __post_init__(self):
        from ... import vision

        self.widths = tuple(self.widths)
        self.attn_kwargs = dict(self.attn_kwargs or {})
        check_options(self)
        if self.data == "mnist" and not self.data_root:
            raise OptionError(ref("data") + " 'mnist' needs " + ref("data_root") + " (a folder with the four MNIST IDX "
                              "files)", "data", "data_root")
        if self.attn in ("none", "", None):
            self.attn = "none"
        else:
            self.attn = vision.canonical_name(self.attn)  # ValueError listing the names
            if self.attn == "ffm":
                raise OptionError(ref("attn") + " 'ffm' (BiSeNet's feature fusion) fuses two paths; a classifier has "
                                  "one", "attn")
        if self.attn == "none" and self.attn_kwargs:
            raise OptionError(ref("attn_kwargs") + " need an attention block (" + ref("attn") + ")", "attn_kwargs",
                              "attn")
        if self.arch == "small-cnn" and len(self.widths) != 3:
            raise OptionError(ref("widths") + " must be three numbers (one per stage), got {given}", "widths",
                              given=self.widths)

    @property
    def augmentation(self) -> str:
        """The augmentation actually used: ``auto`` resolved by the data."""
        if self.augment != "auto":
            return self.augment
        return {"fashion-mnist": "flip", "mnist": "shift", "digits": "none"}[self.data]


@dataclass
class ImageSettings:
    """The settings of an image run's ``predict`` (:class:`~qkv.apps.images.ImageClassifier`); ``evaluate`` takes
    none."""

    invert: bool = option(False, help="invert image files (dark objects on a light background)")


def train_defaults(options: ImageOptions):
    """The trainer's settings for images (the ``qkv train images`` defaults)."""
    from ...train import TrainConfig

    return TrainConfig(epochs=10, batch_size=128, lr=2e-3, weight_decay=0.05, schedule="cosine", warmup_steps=0,
                       monitor="accuracy")
