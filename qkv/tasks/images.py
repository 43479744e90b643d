"""Image classification with channel and spatial attention: the options, data, model, the trainer's task and an
:class:`ImageClassifier` that predicts and returns the attention maps.

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

Example::

    from qkv.tasks.images import ImageClassifier, ImageOptions, ImageTask, train_defaults
    from qkv.train import train
    options = ImageOptions(data="fashion-mnist", arch="small-cnn", attn="cbam")
    train(ImageTask(options), train_defaults(options).replace(max_minutes=10, out="runs/fm-cbam"))
    clf = ImageClassifier.load("runs/fm-cbam")
    clf.predict(clf.read("shirt.png", invert=True)[None])[0].label
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.images import IMAGE_DATASETS, ImageData, ImageExamples, load_image_splits, normalize, random_shift_flip
from ..options import check_options, option
from ..train.task import Task
from .base import load_run, upgrade_options

logger = logging.getLogger(__name__)

__all__ = ["ImageOptions", "load_data", "model_spec", "build_model", "train_defaults", "ImageTask",
           "ImagePrediction", "ImageClassifier", "AttentionView", "attention_view", "predict_logits",
           "count_parameters", "ARCHS", "AUGMENTATIONS"]

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
        from .. import vision

        self.widths = tuple(self.widths)
        self.attn_kwargs = dict(self.attn_kwargs or {})
        check_options(self)
        if self.data == "mnist" and not self.data_root:
            raise ValueError("data 'mnist' needs data_root (a folder with the four MNIST IDX files)")
        if self.attn in ("none", "", None):
            self.attn = "none"
        else:
            self.attn = vision.canonical_name(self.attn)  # ValueError listing the names
            if self.attn == "ffm":
                raise ValueError("attn 'ffm' (BiSeNet's feature fusion) fuses two paths; a classifier has one")
        if self.attn == "none" and self.attn_kwargs:
            raise ValueError("attn_kwargs need an attention block (attn)")
        if self.arch == "small-cnn" and len(self.widths) != 3:
            raise ValueError(f"widths must be three numbers (one per stage), got {self.widths}")

    @property
    def augmentation(self) -> str:
        """The augmentation actually used: ``auto`` resolved by the data."""
        if self.augment != "auto":
            return self.augment
        return {"fashion-mnist": "flip", "mnist": "shift", "digits": "none"}[self.data]


def train_defaults(options: ImageOptions):
    """The trainer's settings for images (the ``qkv train images`` defaults)."""
    from ..train import TrainConfig

    return TrainConfig(epochs=10, batch_size=128, lr=2e-3, weight_decay=0.05, schedule="cosine", warmup_steps=0,
                       monitor="accuracy")


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


def build_model(options: ImageOptions, *, num_classes: int, in_channels: int = 1) -> nn.Module:
    """A new image classifier (see :func:`model_spec`)."""
    from ..models import create

    spec = model_spec(options, num_classes=num_classes, in_channels=in_channels)
    return create(spec["name"], **spec["config"])


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def predict_logits(model: nn.Module, x: Tensor, batch_size: int = 500) -> Tensor:
    """Logits of ``x (N, C, H, W)`` in batches, on the model's device; returned on the CPU as float32."""
    device = next(model.parameters()).device
    with torch.no_grad():
        out = [model(x[i:i + batch_size].to(device)).float().cpu() for i in range(0, len(x), batch_size)]
    return torch.cat(out) if out else torch.empty(0)


class ImageTask(Task):
    """Image classification with label-smoothed cross-entropy; metrics: accuracy and (unsmoothed) loss.

    ``data`` (an :class:`~qkv.data.images.ImageData`) may be given to skip reading ``options.data``.
    """

    name = "images"
    unit = "images"

    def __init__(self, options: ImageOptions, data: ImageData | None = None):
        self.options = options
        self.data = data
        self.mean = self.std = None

    def setup(self) -> None:
        if self.data is None:
            self.data = load_data(self.options)
        x = self.data.splits["train"][0].float() / 255.0
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

    def config(self) -> dict[str, Any]:
        return {"model": model_spec(self.options, num_classes=len(self.data.class_names)),
                "image_size": list(self.data.image_size), "mean": self.mean, "std": self.std,
                "class_names": self.data.class_names, "options": dataclasses.asdict(self.options)}

    def build_model(self) -> nn.Module:
        model = build_model(self.options, num_classes=len(self.data.class_names))
        return model.to(memory_format=torch.channels_last) if self.options.channels_last else model

    def loss(self, model, batch):
        x, y = batch
        logits = model(x)
        loss = F.cross_entropy(logits.float(), y, reduction="sum", label_smoothing=self.options.label_smoothing)
        return loss, len(y), {"correct": (logits.argmax(-1) == y).sum()}

    def evaluate(self, model, split: str) -> dict[str, float]:
        """Accuracy and loss on ``split``; with ``tta="flip"``, of the mean probabilities of each image and its
        left-right mirror (the loss is then the NLL of those mean probabilities)."""
        from ..metrics import classification_metrics

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


# ----------------------------------------------------------------------------------------------- inference

@dataclass
class AttentionView:
    """A batch's probabilities and its attention maps by kind (what ``qkv show-attention`` draws).

    ``spatial``: ``{name: (B, h, w)}``; ``channel``: ``{name: (B, C)}``; ``branches``: ``{name: (B, M, C)}``
    with ``branch_labels[name]``; ``non_local``: ``{name: (B, HW, HW')}`` with ``grids[name] = ((h, w), (h', w'))``.
    """

    probabilities: Tensor
    spatial: dict[str, Tensor] = field(default_factory=dict)
    channel: dict[str, Tensor] = field(default_factory=dict)
    branches: dict[str, Tensor] = field(default_factory=dict)
    branch_labels: dict[str, list[str]] = field(default_factory=dict)
    non_local: dict[str, Tensor] = field(default_factory=dict)
    grids: dict[str, tuple[tuple[int, int], tuple[int, int]]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.spatial or self.channel or self.branches or self.non_local)


def attention_view(model: nn.Module, x: Tensor) -> AttentionView:
    """One forward pass of ``x (B, C, H, W)`` with ``return_attention=True``, its maps sorted by kind.

    The maps come back in the order the blocks ran; forward hooks on the SK and non-local blocks give the
    kernel sizes and the feature-map sizes their maps need.
    """
    from .. import vision

    records: list[tuple[nn.Module, tuple[int, int]]] = []  # SK and non-local blocks, in the order they ran
    hooks = [m.register_forward_hook(lambda mod, args, out: records.append((mod, tuple(args[0].shape[-2:]))))
             for m in model.modules() if isinstance(m, vision.SelectiveKernel | vision.NonLocal)]
    try:
        with torch.no_grad():
            logits, maps = model(x, return_attention=True)
    finally:
        for h in hooks:
            h.remove()
    view = AttentionView(probabilities=logits.float().softmax(-1).cpu())
    pending = iter(records)  # the 3-D maps (SK, non-local) come in the same order
    for name, m in maps.items():
        if isinstance(m, vision.CBAMAttention):
            view.channel[f"{name}.channel"] = m.channel.flatten(1).float().cpu()
            view.spatial[f"{name}.spatial"] = m.spatial[:, 0].float().cpu()
        elif not isinstance(m, Tensor):
            logger.warning("skipping attention map %s of type %s", name, type(m).__name__)
        elif m.dim() == 4 and m.shape[1] == 1 and m.shape[-2:].numel() > 1:
            view.spatial[name] = m[:, 0].float().cpu()
        elif m.dim() == 4 and m.shape[-2:].numel() == 1:
            view.channel[name] = m.flatten(1).float().cpu()
        elif m.dim() == 3 and (rec := next(pending, None)) is not None:
            mod, (h, w) = rec
            if isinstance(mod, vision.SelectiveKernel):
                view.branches[name] = m.float().cpu()
                view.branch_labels[name] = [f"{k}x{k}" for k in mod.kernel_sizes]
                continue
            keys = (h // 2, w // 2) if mod.subsample else (h, w)
            if h * w != m.shape[1] or keys[0] * keys[1] != m.shape[2]:
                logger.warning("skipping non-local map %s: shape %s does not fit a %dx%d feature map", name,
                               tuple(m.shape), h, w)
                continue
            view.non_local[name] = m.float().cpu()
            view.grids[name] = ((h, w), keys)
        else:
            logger.warning("skipping attention map %s of shape %s", name, tuple(m.shape))
    return view


@dataclass
class ImagePrediction:
    """One classified image: the ``label``, its ``probability`` and every class's ``probabilities``."""

    label: str
    probability: float
    probabilities: dict[str, float]


def _upgrade_v1(config: dict[str, Any], state_dict: dict) -> tuple[dict, dict]:
    """A qkv 0.1.0 image run (the model's settings at the top level of the config) in the current format."""
    from ..models.legacy import upgrade_state_dict

    options = upgrade_options(ImageOptions, config["options"])
    arch = config["arch"]
    model: dict[str, Any] = {"num_classes": config["num_classes"], "in_channels": config["in_channels"],
                             "attn": config.get("attn"), "attn_kwargs": config.get("attn_kwargs") or None}
    if arch == "small-cnn":
        model.update(widths=list(config["widths"]), dropout=config["dropout"])
    else:
        model["stem"] = config.get("stem", "imagenet")
    new = {"model": {"name": arch, "config": model}, "options": dataclasses.asdict(options),
           **{k: config[k] for k in ("image_size", "mean", "std", "class_names")}}
    return new, upgrade_state_dict(arch, state_dict)


class ImageClassifier:
    """A trained image run: ``ImageClassifier.load(run_dir)``, then :meth:`predict` and :meth:`attention`."""

    task = ImageTask.name

    def __init__(self, model: nn.Module, config: Mapping[str, Any], options: ImageOptions):
        self.model, self.config, self.options = model.eval(), dict(config), options
        self.image_size = tuple(config["image_size"])
        self.mean, self.std = float(config["mean"]), float(config["std"])
        self.class_names = list(config["class_names"])

    @classmethod
    def load(cls, run_dir: str | os.PathLike, device: str = "cpu") -> ImageClassifier:
        """Read a run directory (its ``best/``, else ``checkpoint/``) or a checkpoint directory, of any release."""
        run = load_run(run_dir, cls.task, _upgrade_v1, ImageOptions, device)
        return cls(run.model, run.config, run.options)

    def read(self, path: str | os.PathLike, *, invert: bool = False) -> Tensor:
        """An image file as this model's input: grey ``(H, W)`` in [0, 1] at the trained size."""
        from ..data.images import read_image

        return read_image(path, self.image_size, invert=invert)

    def test_images(self, data_root: str | None = None) -> tuple[Tensor, Tensor]:
        """The test split the run was evaluated on (``(N, H, W)`` uint8, labels), optionally from another folder."""
        options = self.options if not data_root else dataclasses.replace(self.options, data_root=data_root)
        return load_data(options).splits["test"]

    def _inputs(self, images: Tensor) -> Tensor:
        if images.dim() != 3 or tuple(images.shape[-2:]) != self.image_size:
            raise ValueError(f"images must be (N, {self.image_size[0]}, {self.image_size[1]}), got "
                             f"{tuple(images.shape)}")
        return normalize(images, self.mean, self.std).to(next(self.model.parameters()).device)

    def predict(self, images: Tensor) -> list[ImagePrediction]:
        """Class probabilities of ``images (N, H, W)`` (uint8, or float in [0, 1])."""
        probs = predict_logits(self.model, self._inputs(images)).softmax(-1)
        out = []
        for p in probs:
            k = int(p.argmax())
            out.append(ImagePrediction(self.class_names[k], float(p[k]),
                                       {n: float(v) for n, v in zip(self.class_names, p, strict=True)}))
        return out

    def attention(self, images: Tensor) -> AttentionView:
        """The probabilities and attention maps of ``images (N, H, W)``; a ``ValueError`` for a model without."""
        view = attention_view(self.model, self._inputs(images))
        if view.empty:
            raise ValueError("this model has no attention maps to show (it was trained with attn none)")
        return view
