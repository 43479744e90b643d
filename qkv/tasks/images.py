"""Image classification with channel and spatial attention: data + augmentation + an attention CNN + the shared
trainer, and the commands ``qkv train images`` and ``qkv show-attention``.

Data (grey images, one channel):

- ``fashion-mnist``: the IDX files of Fashion-MNIST (Xiao, Rasul and Vollgraf, 2017), by default from Debian's
  ``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist``); ``--data-root`` reads any folder with the
  same four files. Augmentation: horizontal flips (clothes are left-right symmetric, their classes too).
  Two 6-epoch runs with random shifts as well (``--augment shift-flip``) tested 0.6 and 1.3 points lower than
  one with flips only (BENCHMARKS.md gives the other settings), so shifts are not the default.
- ``mnist``: any MNIST-style IDX folder (``--data-root`` is required); classes named ``0`` ... ``9``.
  Augmentation: shifts only (a flipped digit is not the same digit).
- ``digits``: scikit-learn's bundled 8x8 digits (1,797 images), upsampled to 16x16 (bilinear), for tiny tests;
  it has no test split, so one is held out (``--test`` fraction). No augmentation.

A validation split (``--valid`` fraction) is held out from the training images by a permutation drawn from
``--data-seed``, independent of the training seed. Pixels are scaled to [0, 1] and normalised by the mean and
standard deviation of the training split, which the checkpoint keeps. Augmentation happens in ``collate``
with the global torch RNG, whose state the trainer checkpoints: a resumed run draws the same shifts.

Models: ``small-cnn`` (:class:`qkv.models.small_cnn.SmallCNN`, made for 28x28) and ``resnet18/34/50/101``
(:mod:`qkv.models.resnet`). The ResNets are the ImageNet architectures with one input channel; by default
(``--stem cifar``) their 7x7 stride-2 stem and max-pool are replaced by a 3x3 stride-1 convolution, as the
ResNet paper does for CIFAR-10, so that a 28x28 image keeps 28x28 features in the first stage (the stages
and blocks are the ImageNet ones, not the paper's narrower CIFAR ResNets). ``--stem imagenet`` keeps the
original stem. ``--attn`` takes any :mod:`qkv.vision` name; each block goes where its paper puts it.

Example::

    qkv train images --data fashion-mnist --arch small-cnn --attn cbam --out runs/fm-cbam --max-minutes 10
    qkv show-attention runs/fm-cbam shirt.png --index 0 --index 7 --out pictures/ --invert
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..train.task import Task
from .common import print_result

logger = logging.getLogger(__name__)

DATASETS = ("fashion-mnist", "mnist", "digits")
ARCHS = ("small-cnn", "resnet18", "resnet34", "resnet50", "resnet101")
AUGMENTATIONS = ("auto", "none", "flip", "shift", "shift-flip")
TTAS = ("none", "flip")
STEMS = ("cifar", "imagenet")
DIGITS_SIZE = 16  # scikit-learn's 8x8 digits are upsampled to this


@dataclass
class ImageOptions:
    """What to train on and which model; the trainer's settings are in :class:`qkv.train.TrainConfig`."""

    data: str = "fashion-mnist"  # fashion-mnist | mnist | digits
    data_root: str | None = None  # an MNIST-style IDX folder (default for fashion-mnist: the Debian package's)
    valid: float = 0.1  # fraction of the training images held out for validation
    test: float = 0.2  # digits only (it has no test split): fraction of all images held out for the test
    data_seed: int = 0  # seed of the held-out splits (independent of the training seed)
    augment: str = "auto"  # auto (by data) | none | flip | shift | shift-flip
    shift: int = 2  # largest random shift in pixels
    arch: str = "small-cnn"  # small-cnn | resnet18 | resnet34 | resnet50 | resnet101
    attn: str = "none"  # none, or any qkv.vision block name (se, eca, cbam, sk, non_local, ...)
    attn_kwargs: dict[str, Any] = field(default_factory=dict)  # for every attention block, e.g. {"reduction": 8}
    widths: tuple[int, ...] = (32, 64, 128)  # small-cnn: channels of its three stages
    dropout: float = 0.1  # small-cnn: before the classifier
    stem: str = "cifar"  # resnets: cifar (3x3 stride 1, no max-pool) | imagenet (7x7 stride 2 + max-pool)
    label_smoothing: float = 0.1
    eval_batch: int = 500  # images per forward pass in evaluation
    channels_last: bool = True  # train and evaluate in the channels-last memory format (faster oneDNN/cuDNN convs)
    tta: str = "none"  # test-time augmentation in evaluation: none | flip (average the image's and its mirror's)

    def __post_init__(self):
        from .. import vision

        self.widths = tuple(int(w) for w in self.widths)
        self.attn_kwargs = dict(self.attn_kwargs or {})
        if self.data not in DATASETS:
            raise ValueError(f"data must be one of {', '.join(DATASETS)}, got {self.data!r}")
        if self.data == "mnist" and not self.data_root:
            raise ValueError("--data mnist needs --data-root (a folder with the four MNIST IDX files)")
        if self.data == "digits" and self.data_root:
            raise ValueError("--data-root is for IDX folders; digits come with scikit-learn")
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {', '.join(ARCHS)}, got {self.arch!r}")
        if self.attn in ("none", "", None):
            self.attn = "none"
        else:
            self.attn = vision.canonical_name(self.attn)  # ValueError listing the names
            if self.attn == "ffm":
                raise ValueError("attn 'ffm' (BiSeNet's feature fusion) fuses two paths; a classifier has one")
        if self.attn == "none" and self.attn_kwargs:
            raise ValueError("attention arguments need an attention block (--attn)")
        if self.augment not in AUGMENTATIONS:
            raise ValueError(f"augment must be one of {', '.join(AUGMENTATIONS)}, got {self.augment!r}")
        if self.tta not in TTAS:
            raise ValueError(f"tta must be one of {', '.join(TTAS)}, got {self.tta!r}")
        if self.stem not in STEMS:
            raise ValueError(f"stem must be one of {', '.join(STEMS)}, got {self.stem!r}")
        for name in ("valid", "test"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be a fraction in (0, 1), got {getattr(self, name)}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.shift < 0:
            raise ValueError(f"shift must be >= 0 pixels, got {self.shift}")
        if self.eval_batch < 1:
            raise ValueError(f"eval_batch must be >= 1, got {self.eval_batch}")

    @property
    def augmentation(self) -> str:
        """The augmentation actually used: ``auto`` resolved by the data."""
        if self.augment != "auto":
            return self.augment
        return {"fashion-mnist": "flip", "mnist": "shift", "digits": "none"}[self.data]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["widths"] = list(self.widths)
        return d


# ----------------------------------------------------------------------------------------------- data

@dataclass
class ImageData:
    """Splits of grey images: ``{split: (images (N, H, W) uint8, labels (N,) int64)}`` and the class names."""

    splits: dict[str, tuple[Tensor, Tensor]]
    class_names: list[str]

    @property
    def image_size(self) -> tuple[int, int]:
        return tuple(self.splits["train"][0].shape[-2:])


def load_digits_images() -> tuple[Tensor, Tensor]:
    """scikit-learn's 1,797 digits, upsampled from 8x8 to 16x16 and scaled to uint8: ``(N, 16, 16), (N,)``."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("--data digits needs scikit-learn: pip install 'qkv[train]'") from e
    digits = load_digits()
    x = torch.from_numpy(digits.images).float()[:, None] / 16.0  # values 0..16
    x = F.interpolate(x, size=(DIGITS_SIZE, DIGITS_SIZE), mode="bilinear", align_corners=False)
    x = (x[:, 0].clamp(0, 1) * 255).round().to(torch.uint8)
    return x, torch.from_numpy(digits.target).long()


def _permutation(n: int, seed: int) -> Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


def load_image_data(opts: ImageOptions) -> ImageData:
    """The ``train``, ``valid`` and ``test`` splits ``opts`` describes (deterministic in ``opts.data_seed``).

    Raises ``FileNotFoundError`` (with install advice for Fashion-MNIST) when IDX files are missing.
    """
    from ..data.idx import FASHION_MNIST_CLASSES, FASHION_MNIST_ROOT, load_fashion_mnist, load_idx_dataset

    if opts.data == "digits":
        images, labels = load_digits_images()
        perm = _permutation(len(labels), opts.data_seed)
        n_test = max(1, round(opts.test * len(labels)))
        test_idx, rest = perm[:n_test], perm[n_test:]
        train = (images[rest], labels[rest])
        test = (images[test_idx], labels[test_idx])
        names = [str(i) for i in range(10)]
    else:
        if opts.data == "fashion-mnist":
            root = opts.data_root or FASHION_MNIST_ROOT
            train, test = (load_fashion_mnist(root, s) for s in ("train", "test"))
        else:
            train, test = (load_idx_dataset(opts.data_root, s) for s in ("train", "test"))
        if train[0].shape[-2:] != test[0].shape[-2:]:
            raise ValueError(f"train images are {tuple(train[0].shape[-2:])} but test images "
                             f"{tuple(test[0].shape[-2:])}")
        classes = int(max(train[1].max(), test[1].max())) + 1
        names = list(FASHION_MNIST_CLASSES) if opts.data == "fashion-mnist" and classes <= 10 else \
            [str(i) for i in range(classes)]
    n = len(train[1])
    perm = _permutation(n, opts.data_seed + 1)
    n_valid = max(1, round(opts.valid * n))
    if n_valid >= n:
        raise ValueError(f"valid={opts.valid} leaves no training images out of {n}")
    valid_idx, train_idx = perm[:n_valid], perm[n_valid:]
    splits = {"train": (train[0][train_idx], train[1][train_idx]),
              "valid": (train[0][valid_idx], train[1][valid_idx]), "test": test}
    logger.info("%s: %d train, %d valid, %d test images of %dx%d, %d classes", opts.data,
                *(len(splits[s][1]) for s in ("train", "valid", "test")), *train[0].shape[-2:], len(names))
    return ImageData(splits, names)


class ImageExamples:
    """Indexable ``(image (H, W) uint8, label)`` pairs, for the trainer."""

    def __init__(self, images: Tensor, labels: Tensor):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        return self.images[i], int(self.labels[i])


def random_shift_flip(images: Tensor, shift: int = 2, flip: bool = False) -> Tensor:
    """Shift every image of ``images (B, H, W)`` by a random ``(dy, dx)`` in ``[-shift, shift]`` (zero padding,
    then a random crop), and flip it left-right with probability 1/2 when ``flip``. Uses the global torch RNG."""
    b, h, w = images.shape
    out = images
    if shift > 0:
        padded = F.pad(images, (shift, shift, shift, shift))
        oy = torch.randint(0, 2 * shift + 1, (b,))
        ox = torch.randint(0, 2 * shift + 1, (b,))
        rows = (oy[:, None] + torch.arange(h))[:, :, None]  # (B, H, 1)
        cols = (ox[:, None] + torch.arange(w))[:, None, :]  # (B, 1, W)
        out = padded[torch.arange(b)[:, None, None], rows, cols]
    if flip:
        mask = torch.rand(b) < 0.5
        out = torch.where(mask[:, None, None], out.flip(-1), out)
    return out


def normalize(images: Tensor, mean: float, std: float) -> Tensor:
    """``images (B, H, W)`` uint8 (0..255) or float (0..1) -> ``(B, 1, H, W)`` float, ``(x - mean) / std``."""
    x = images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
    return ((x - mean) / std)[:, None]


# ----------------------------------------------------------------------------------------------- models

def cifar_stem(model: nn.Module, in_channels: int) -> nn.Module:
    """Replace a :class:`~qkv.models.resnet.ResNet`'s 7x7 stride-2 stem and max-pool by a 3x3 stride-1
    convolution (He et al.'s CIFAR-10 stem), for small images. In place; returns ``model``."""
    conv = nn.Conv2d(in_channels, model.conv1.out_channels, 3, 1, 1, bias=False)
    nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
    model.conv1 = conv
    model.maxpool = nn.Identity()
    return model


def build_model(config: Mapping[str, Any]) -> nn.Module:
    """Rebuild an image classifier from a checkpoint's ``config`` (see :meth:`ImageTask.config`)."""
    arch, attn = config["arch"], config.get("attn")
    kwargs = dict(config.get("attn_kwargs") or {}) or None
    if arch == "small-cnn":
        from ..models.small_cnn import SmallCNN

        return SmallCNN(config["num_classes"], config["in_channels"], widths=config["widths"], attn=attn,
                        attn_kwargs=kwargs, dropout=config["dropout"])
    from ..models.resnet import create_resnet

    if arch not in ARCHS:
        raise ValueError(f"unknown image architecture {arch!r}; expected one of {', '.join(ARCHS)}")
    model = create_resnet(arch, num_classes=config["num_classes"], in_channels=config["in_channels"], attn=attn,
                          attn_kwargs=kwargs)
    if config.get("stem", "imagenet") == "cifar":
        cifar_stem(model, config["in_channels"])
    return model


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------------------------- the task

class ImageTask(Task):
    """Image classification with label-smoothed cross-entropy; metrics: accuracy and (unsmoothed) loss.

    ``data`` (an :class:`ImageData`) may be given to skip reading ``opts.data`` (e.g. once for many runs).
    """

    name = "images"
    unit = "images"

    def __init__(self, opts: ImageOptions, data: ImageData | None = None):
        self.opts = opts
        self.data = data
        self.mean = self.std = None

    def setup(self) -> None:
        if self.data is None:
            self.data = load_image_data(self.opts)
        x = self.data.splits["train"][0].float() / 255.0
        self.mean, self.std = float(x.mean()), float(x.std().clamp_min(1e-6))

    def train_examples(self):
        return ImageExamples(*self.data.splits["train"])

    def collate(self, examples):
        images = torch.stack([x for x, _ in examples])
        labels = torch.tensor([y for _, y in examples], dtype=torch.long)
        aug = self.opts.augmentation
        if aug != "none":
            shift = self.opts.shift if aug in ("shift", "shift-flip") else 0
            images = random_shift_flip(images, shift, flip=aug in ("flip", "shift-flip"))
        return self._layout(normalize(images, self.mean, self.std)), labels

    def _layout(self, x: Tensor) -> Tensor:
        return x.contiguous(memory_format=torch.channels_last) if self.opts.channels_last else x

    def config(self) -> dict[str, Any]:
        o = self.opts
        return {"arch": o.arch, "attn": None if o.attn == "none" else o.attn, "attn_kwargs": o.attn_kwargs,
                "num_classes": len(self.data.class_names), "in_channels": 1, "widths": list(o.widths),
                "dropout": o.dropout, "stem": o.stem, "image_size": list(self.data.image_size), "mean": self.mean,
                "std": self.std, "class_names": self.data.class_names, "options": o.to_dict()}

    def build_model(self) -> nn.Module:
        model = build_model(self.config())
        return model.to(memory_format=torch.channels_last) if self.opts.channels_last else model

    def loss(self, model, batch):
        x, y = batch
        logits = model(x)
        loss = F.cross_entropy(logits.float(), y, reduction="sum", label_smoothing=self.opts.label_smoothing)
        return loss, len(y), {"correct": (logits.argmax(-1) == y).sum()}

    def evaluate(self, model, split: str) -> dict[str, float]:
        """Accuracy and loss on ``split``; with ``tta="flip"``, of the mean probabilities of each image and its
        left-right mirror (the loss is then the NLL of those mean probabilities)."""
        if split not in self.data.splits or split == "train":
            raise ValueError(f"no split {split!r}; one of valid, test")
        images, labels = self.data.splits[split]
        x = self._layout(normalize(images, self.mean, self.std))
        logits = predict_logits(model, x, self.opts.eval_batch)
        if self.opts.tta == "flip":
            mirrored = predict_logits(model, x.flip(-1), self.opts.eval_batch)
            probs = (logits.softmax(-1) + mirrored.softmax(-1)) / 2
            logits = probs.clamp_min(torch.finfo(probs.dtype).tiny).log()  # log-probabilities: CE = NLL of probs
        return {"accuracy": float((logits.argmax(-1) == labels).double().mean()),
                "loss": float(F.cross_entropy(logits, labels))}


def predict_logits(model: nn.Module, x: Tensor, batch_size: int = 500) -> Tensor:
    """Logits of ``x (N, C, H, W)`` in batches, on the model's device; returned on the CPU as float32."""
    device = next(model.parameters()).device
    out = [model(x[i:i + batch_size].to(device)).float().cpu() for i in range(0, len(x), batch_size)]
    return torch.cat(out) if out else torch.empty(0)


# ----------------------------------------------------------------------------------------------- show-attention

def read_image(path: str | Path, size: tuple[int, int], *, invert: bool = False) -> Tensor:
    """An image file (PNG, JPEG, ... through Pillow when installed, else matplotlib's PNG reader) as grey
    ``(H, W)`` float in [0, 1], resized to ``size`` (bilinear, antialiased). ``invert`` turns dark-on-light
    pictures into the light-on-dark of (Fashion-)MNIST."""
    import numpy as np

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no image file {str(path)!r}")
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow comes with matplotlib
        Image = None
    try:
        if Image is not None:
            with Image.open(path) as im:
                a = np.asarray(im.convert("L"), dtype=np.float64) / 255.0
        else:
            from matplotlib.image import imread

            a = np.asarray(imread(path), dtype=np.float64)
            if a.max() > 1.0:
                a = a / 255.0
            if a.ndim == 3:
                a = a[..., :3] @ np.array([0.299, 0.587, 0.114]) if a.shape[-1] >= 3 else a[..., 0]
    except Exception as e:  # any decoder error means the same to the user
        raise ValueError(f"cannot read image {str(path)!r}: {e}") from None
    t = torch.from_numpy(np.ascontiguousarray(a)).float()[None, None]
    if tuple(t.shape[-2:]) != tuple(size):
        t = F.interpolate(t, size=tuple(size), mode="bilinear", align_corners=False, antialias=True)
    t = t[0, 0].clamp(0, 1)
    return 1.0 - t if invert else t


def _parse_pixel(text: str | None, size: tuple[int, int]) -> tuple[int, int]:
    h, w = size
    if text is None:
        return h // 2, w // 2
    try:
        y, x = (int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"--query-pixel must be 'y,x' (two integers), got {text!r}") from None
    if not (0 <= y < h and 0 <= x < w):
        raise ValueError(f"--query-pixel {y},{x} is outside the model's {h}x{w} input")
    return y, x


@dataclass
class AttentionView:
    """Everything ``show-attention`` draws for a batch: the model's probabilities and its maps by kind.

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


def show_attention(model: nn.Module, images: Tensor, names: list[str], out_dir: str | Path, *, mean: float,
                   std: float, class_names: list[str], labels: list[int | None] | None = None,
                   query_pixel: tuple[int, int] | None = None) -> list[tuple[str, str, float, list[Path]]]:
    """Draw the attention of ``model`` on ``images (B, H, W)`` (float in [0, 1]) into ``out_dir``.

    Per image ``NAME``: ``NAME-spatial.png`` (spatial maps over the image), ``NAME-channel.png`` (channel
    weights as bars), ``NAME-sk.png`` (selective-kernel branch weights) and ``NAME-nonlocal.png`` (the
    non-local attention of ``query_pixel`` ``(y, x)``, default the centre), each only when the model has such
    maps. Returns ``[(name, predicted class, probability, [paths])]``.
    """
    from ..viz.heatmap import _pyplot
    from ..viz.vision import branch_weights, channel_bars, overlay, query_map, save_figure

    plt = _pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    view = attention_view(model, normalize(images, mean, std).to(device))
    if not (view.spatial or view.channel or view.branches or view.non_local):
        raise ValueError("this model has no attention maps to show (it was trained with --attn none)")
    size = tuple(images.shape[-2:])
    qy, qx = query_pixel if query_pixel is not None else (size[0] // 2, size[1] // 2)
    labels = labels or [None] * len(images)
    results = []
    for i, (name, image) in enumerate(zip(names, images, strict=True)):
        p, k = view.probabilities[i].max(-1)
        pred = class_names[int(k)] if int(k) < len(class_names) else str(int(k))
        caption = f"{name}: {pred} ({float(p):.2f})"
        if labels[i] is not None:
            caption += f", true {class_names[labels[i]]}"
        paths: list[Path] = []
        if view.spatial:
            n = len(view.spatial) + 1
            fig, axes = plt.subplots(1, n, figsize=(2.9 * n, 3.0), squeeze=False)
            axes[0, 0].imshow(image.numpy(), cmap="gray")
            axes[0, 0].set_title("input", fontsize=9)
            axes[0, 0].axis("off")
            for ax, (key, m) in zip(axes[0, 1:], view.spatial.items(), strict=True):
                overlay(image, m[i], ax=ax, title=f"{key} ({m.shape[-2]}x{m.shape[-1]}): "
                        f"{float(m[i].min()):.2f} to {float(m[i].max()):.2f}")
            fig.suptitle(caption, fontsize=10)
            paths.append(save_figure(fig, out_dir / f"{name}-spatial.png"))
        if view.channel:
            n = len(view.channel)
            fig, axes = plt.subplots(n, 1, figsize=(7.0, 2.0 * n + 0.6), squeeze=False)
            for ax, (key, m) in zip(axes[:, 0], view.channel.items(), strict=True):
                channel_bars(m[i], ax=ax)
                ax.set_title(f"{key}: {ax.get_title()}", fontsize=9)
            fig.suptitle(caption, fontsize=10)
            paths.append(save_figure(fig, out_dir / f"{name}-channel.png"))
        if view.branches:
            n = len(view.branches)
            fig, axes = plt.subplots(n, 1, figsize=(7.0, 1.6 * n + 0.6), squeeze=False)
            for ax, (key, m) in zip(axes[:, 0], view.branches.items(), strict=True):
                branch_weights(m[i], labels=view.branch_labels[key], ax=ax, title=f"{key}: weight per channel")
            fig.suptitle(caption, fontsize=10)
            paths.append(save_figure(fig, out_dir / f"{name}-sk.png"))
        if view.non_local:
            n = len(view.non_local)
            fig, axes = plt.subplots(1, n, figsize=(3.3 * n, 3.2), squeeze=False)
            for ax, (key, m) in zip(axes[0], view.non_local.items(), strict=True):
                (h, w), keys = view.grids[key]
                row = m[i, (qy * h // size[0]) * w + qx * w // size[1]]
                query_map(image, row, (qy, qx), key_shape=keys, ax=ax, title=f"{key}: query ({qy}, {qx})")
            fig.suptitle(caption, fontsize=10)
            paths.append(save_figure(fig, out_dir / f"{name}-nonlocal.png"))
        results.append((name, pred, float(p), paths))
    return results


# ----------------------------------------------------------------------------------------------- commands

def _parse_attn_args(items: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--attn-arg must be KEY=VALUE (e.g. reduction=8), got {item!r}")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def _options_from_args(args: argparse.Namespace) -> ImageOptions:
    names = {f.name for f in dataclasses.fields(ImageOptions)}
    values = {k: v for k, v in vars(args).items() if k in names and v is not None}
    values["attn_kwargs"] = _parse_attn_args(args.attn_arg)
    if isinstance(values.get("widths"), str):
        try:
            values["widths"] = tuple(int(w) for w in values["widths"].split(","))
        except ValueError:
            raise ValueError(f"--widths must be integers like 32,64,128, got {values['widths']!r}") from None
    return ImageOptions(**values)


def _train_defaults():
    from ..train import TrainConfig

    return TrainConfig(epochs=10, batch_size=128, lr=2e-3, weight_decay=0.05, schedule="cosine", warmup_steps=0)


def cmd_train(args: argparse.Namespace) -> int:
    from ..train import config_from_args, train

    opts = _options_from_args(args)
    cfg = config_from_args(args, _train_defaults(), monitor="accuracy", extra={"command": " ".join(sys.argv)})
    task = ImageTask(opts)
    try:
        result = train(task, cfg)
    except FileNotFoundError as e:
        raise ValueError(str(e)) from None
    print(f"{opts.arch} with attention {opts.attn}: {count_parameters(result.model):,} parameters")
    print_result(result)
    return 0


def cmd_show_attention(args: argparse.Namespace) -> int:
    from ..train import load_model, resolve_device

    try:
        model, ckpt = load_model(args.checkpoint, build_model, device=resolve_device(args.device),
                                 task=ImageTask.name)
    except FileNotFoundError as e:
        raise ValueError(str(e)) from None
    config = ckpt.config
    size = tuple(config["image_size"])
    if not args.images and not args.index:
        raise ValueError("give image files and/or --index N (an image of the test split)")
    query = _parse_pixel(args.query_pixel, size)
    pictures, names, labels = [], [], []
    for path in args.images:
        pictures.append(read_image(path, size, invert=args.invert))
        names.append(Path(path).stem)
        labels.append(None)
    if args.index:
        opts = ImageOptions(**{**config["options"], **({"data_root": args.data_root} if args.data_root else {})})
        try:
            images, targets = load_image_data(opts).splits["test"]
        except FileNotFoundError as e:
            raise ValueError(str(e)) from None
        for n in args.index:
            if not 0 <= n < len(targets):
                raise ValueError(f"--index {n} is out of range: the {opts.data} test split has {len(targets)} images "
                                 f"(0 to {len(targets) - 1})")
            pictures.append(images[n].float() / 255.0)
            names.append(f"test{n}")
            labels.append(int(targets[n]))
    results = show_attention(model, torch.stack(pictures), names, args.out, mean=config["mean"], std=config["std"],
                             class_names=config["class_names"], labels=labels, query_pixel=query)
    for (name, pred, prob, paths), label in zip(results, labels, strict=True):
        truth = f" (true: {config['class_names'][label]})" if label is not None else ""
        print(f"{name}: {pred} {prob:.3f}{truth}")
        for p in paths:
            print(f"wrote {p}")
    return 0


def register_cli(commands, train_commands) -> None:
    from ..train import add_arguments

    d = ImageOptions()
    p = train_commands.add_parser("images", help="train an image classifier with channel/spatial attention",
                                  formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument("--data", default=d.data, choices=DATASETS,
                   help="fashion-mnist, mnist (any MNIST-style IDX folder) or scikit-learn's digits")
    g.add_argument("--data-root", default=None,
                   help="folder with the IDX files (default for fashion-mnist: /usr/share/datasets/fashion-mnist)")
    g.add_argument("--valid", type=float, default=d.valid, help="fraction of the training images for validation")
    g.add_argument("--test", type=float, default=d.test, help="digits: fraction held out as the test split")
    g.add_argument("--data-seed", type=int, default=d.data_seed, help="seed of the held-out splits")
    g.add_argument("--augment", default=d.augment, choices=AUGMENTATIONS,
                   help="auto: flips for fashion-mnist, shifts for mnist, none for digits")
    g.add_argument("--shift", type=int, default=d.shift, help="largest random shift (pixels)")
    g = p.add_argument_group("model")
    g.add_argument("--arch", default=d.arch, choices=ARCHS)
    g.add_argument("--attn", default=d.attn,
                   help="none or a qkv.vision block: se, eca, cbam, cbam_channel, cbam_spatial, sk, non_local, arm")
    g.add_argument("--attn-arg", action="append", metavar="KEY=VALUE",
                   help="argument of every attention block, e.g. reduction=8 or mode=dot (repeatable)")
    g.add_argument("--widths", default=",".join(map(str, d.widths)), help="small-cnn: channels of its 3 stages")
    g.add_argument("--dropout", type=float, default=d.dropout, help="small-cnn: dropout before the classifier")
    g.add_argument("--stem", default=d.stem, choices=STEMS,
                   help="resnets: cifar (3x3 stride 1, no max-pool, for 28x28) or the original imagenet stem")
    g.add_argument("--label-smoothing", type=float, default=d.label_smoothing)
    g.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=d.channels_last,
                   help="channels-last memory format for the model and batches (default: on; faster convolutions)")
    g.add_argument("--tta", default=d.tta, choices=TTAS,
                   help="test-time augmentation in evaluation: flip averages each image's probabilities with its "
                        "mirror's (for left-right symmetric classes such as Fashion-MNIST's)")
    add_arguments(p, _train_defaults())
    p.set_defaults(func=cmd_train)

    p = commands.add_parser("show-attention", help="draw an image model's attention maps (PNG)")
    p.add_argument("checkpoint", help="run directory or checkpoint directory of `qkv train images`")
    p.add_argument("images", nargs="*", metavar="IMAGE",
                   help="image files (PNG, JPEG...), converted to grey; give them before the options")
    p.add_argument("--index", type=int, action="append", default=[], metavar="N",
                   help="an image of the test split (repeatable)")
    p.add_argument("--out", default="attention", help="folder for the PNGs (default %(default)s)")
    p.add_argument("--query-pixel", default=None, metavar="Y,X",
                   help="non-local: the query pixel, in input pixels (default: the centre)")
    p.add_argument("--invert", action="store_true", help="invert image files (dark objects on a light background)")
    p.add_argument("--data-root", default=None, help="IDX folder for --index, if not the one trained on")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    p.set_defaults(func=cmd_show_attention)


__all__ = ["ImageOptions", "ImageData", "ImageTask", "ImageExamples", "AttentionView", "load_image_data",
           "load_digits_images", "random_shift_flip", "normalize", "cifar_stem", "build_model", "count_parameters",
           "predict_logits", "read_image", "attention_view", "show_attention", "register_cli", "DATASETS", "ARCHS",
           "AUGMENTATIONS", "TTAS"]
