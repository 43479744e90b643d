"""Grey image data for the image applications: splits of IDX data sets or scikit-learn's digits, augmentation,
normalisation and reading image files.

- :func:`load_image_splits`: ``train``/``valid``/``test`` splits of Fashion-MNIST, any MNIST-style IDX folder, or
  scikit-learn's 8x8 digits (upsampled to 16x16), held out by permutations drawn from a seed.
- :func:`random_shift_flip`: random shifts and left-right flips of a batch (the global torch RNG, which the
  trainer checkpoints, so a resumed run draws the same ones).
- :func:`normalize`: uint8 or [0, 1] pixels -> ``(x - mean) / std`` with a channel axis.
- :func:`read_image`: an image file (PNG, JPEG, ...) as grey ``(H, W)`` in [0, 1], resized.
- :func:`image_array`: a Pillow image as floats in [0, 1]: 16-bit and 32-bit integer images scaled by their type's
  range (not clipped at 255), float images by theirs, transparent ones composited on :data:`BACKGROUND` (with a
  warning).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

logger = logging.getLogger(__name__)

__all__ = ["ImageData", "ImageExamples", "IMAGE_DATASETS", "DIGITS_SIZE", "load_image_splits", "load_digits_images",
           "random_shift_flip", "normalize", "read_image", "image_array", "image_8bit", "BACKGROUND"]

IMAGE_DATASETS = ("fashion-mnist", "mnist", "digits")
DIGITS_SIZE = 16  # scikit-learn's 8x8 digits are upsampled to this
BACKGROUND = 1.0  # transparent pixels are composited on white (how image viewers show them), in [0, 1]


@dataclass
class ImageData:
    """Splits of grey images: ``{split: (images (N, H, W) uint8, labels (N,) int64)}`` and the class names."""

    splits: dict[str, tuple[Tensor, Tensor]]
    class_names: list[str]

    @property
    def image_size(self) -> tuple[int, int]:
        return tuple(self.splits["train"][0].shape[-2:])


class ImageExamples:
    """Indexable ``(image (H, W) uint8, label)`` pairs, for the trainer."""

    def __init__(self, images: Tensor, labels: Tensor):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        return self.images[i], int(self.labels[i])


def load_digits_images() -> tuple[Tensor, Tensor]:
    """scikit-learn's 1,797 digits, upsampled from 8x8 to 16x16 and scaled to uint8: ``(N, 16, 16), (N,)``."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("the digits data needs scikit-learn: pip install 'qkv[train]'") from e
    digits = load_digits()
    x = torch.from_numpy(digits.images).float()[:, None] / 16.0  # values 0..16
    x = F.interpolate(x, size=(DIGITS_SIZE, DIGITS_SIZE), mode="bilinear", align_corners=False)
    x = (x[:, 0].clamp(0, 1) * 255).round().to(torch.uint8)
    return x, torch.from_numpy(digits.target).long()


def _permutation(n: int, seed: int) -> Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


def load_image_splits(name: str, *, root: str | None = None, valid: float = 0.1, test: float = 0.2,
                      seed: int = 0) -> ImageData:
    """The ``train``, ``valid`` and ``test`` splits of data set ``name`` (deterministic in ``seed``).

    Args:
        name: ``fashion-mnist`` (Debian's ``dataset-fashion-mnist`` unless ``root``), ``mnist`` (any MNIST-style
            IDX folder ``root``) or ``digits`` (scikit-learn's; it has no test split, so ``test`` of it is held out).
        valid: fraction of the training images held out for validation.

    Raises ``FileNotFoundError`` (with install advice for Fashion-MNIST) when IDX files are missing, and
    ``ValueError`` when a split would be empty.
    """
    from .idx import FASHION_MNIST_CLASSES, FASHION_MNIST_ROOT, load_fashion_mnist, load_idx_dataset

    if name not in IMAGE_DATASETS:
        raise ValueError(f"image data must be one of {', '.join(IMAGE_DATASETS)}, got {name!r}")
    if name == "digits":
        images, labels = load_digits_images()
        perm = _permutation(len(labels), seed)
        n_test = max(1, round(test * len(labels)))
        test_idx, rest = perm[:n_test], perm[n_test:]
        train_split, test_split = (images[rest], labels[rest]), (images[test_idx], labels[test_idx])
        names = [str(i) for i in range(10)]
    else:
        if name == "mnist" and not root:
            raise ValueError("mnist data needs a root folder with the four MNIST IDX files")
        load = (lambda s: load_fashion_mnist(root or FASHION_MNIST_ROOT, s)) if name == "fashion-mnist" else \
            (lambda s: load_idx_dataset(root, s))
        train_split, test_split = load("train"), load("test")
        if train_split[0].shape[-2:] != test_split[0].shape[-2:]:
            raise ValueError(f"train images are {tuple(train_split[0].shape[-2:])} but test images "
                             f"{tuple(test_split[0].shape[-2:])}")
        classes = int(max(train_split[1].max(), test_split[1].max())) + 1
        names = list(FASHION_MNIST_CLASSES) if name == "fashion-mnist" and classes <= 10 else \
            [str(i) for i in range(classes)]
    n = len(train_split[1])
    n_valid = max(1, round(valid * n))
    if n_valid >= n or len(test_split[1]) == 0:
        raise ValueError(f"{name}: {n} training and {len(test_split[1])} test images cannot give non-empty train, "
                         f"valid ({valid}) and test splits")
    perm = _permutation(n, seed + 1)
    valid_idx, train_idx = perm[:n_valid], perm[n_valid:]
    splits = {"train": (train_split[0][train_idx], train_split[1][train_idx]),
              "valid": (train_split[0][valid_idx], train_split[1][valid_idx]), "test": test_split}
    logger.info("%s: %d train, %d valid, %d test images of %dx%d, %d classes", name,
                *(len(splits[s][1]) for s in ("train", "valid", "test")), *train_split[0].shape[-2:], len(names))
    return ImageData(splits, names)


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


def _scaled(a, mode: str, name: str):
    """A single-band image of integers or floats as float64 in [0, 1] (see :func:`image_array`)."""
    import numpy as np

    a = np.asarray(a, dtype=np.float64)
    if mode.startswith("I;16"):
        return a / 65535.0
    finite = a[np.isfinite(a)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if mode == "F" and lo >= 0 and hi <= 1:
        out = a
    elif mode == "F" and lo >= 0 and hi <= 255:
        out = a / 255.0
    elif mode == "I" and lo >= 0 and hi <= 65535:  # 16-bit data that Pillow opened as 32-bit integers
        out = a / 65535.0
    else:
        logger.warning("%s: pixel values from %g to %g (mode %s) are stretched to [0, 1]", name, lo, hi, mode)
        out = (a - lo) / (hi - lo) if hi > lo else np.zeros_like(a)
    return np.nan_to_num(np.clip(out, 0.0, 1.0), nan=0.0)


def _transparent(im) -> bool:
    has = getattr(im, "has_transparency_data", None)
    if has is not None:
        return bool(has)
    return im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in im.info  # pragma: no cover


def image_array(im, *, grey: bool, background: float = BACKGROUND, name: str = "image"):
    """A Pillow image as float64 ``(H, W)`` (``grey``) or ``(H, W, 3)`` in [0, 1].

    16-bit grey images (modes ``I;16*``, and ``I`` holding values up to 65535) are divided by 65535 and float images
    (``F``) in [0, 1] or [0, 255] by 1 or 255; other ranges are stretched from their minimum to their maximum, with a
    warning. Images with transparency (``RGBA``, ``LA``, ``P`` with a transparent colour) that is used are composited
    on a plain ``background`` (a grey level in [0, 1]; white by default) with a warning naming ``name``. Everything
    else goes through Pillow's ``convert`` (``L`` uses ITU-R 601-2 luma).
    """
    import numpy as np

    if im.mode in ("I", "F") or im.mode.startswith("I;16"):
        a = _scaled(im, im.mode, name)
        return a if grey else np.repeat(a[..., None], 3, axis=-1)
    if _transparent(im):
        rgba = im.convert("RGBA")
        if rgba.getchannel("A").getextrema()[0] < 255:  # transparency that is used
            logger.warning("%s is transparent: composited on a background of grey level %g (%s)", name, background,
                           "white" if background == 1.0 else "black" if background == 0.0 else "grey")
            x = np.asarray(rgba, dtype=np.float64) / 255.0
            alpha = x[..., 3:]
            rgb = x[..., :3] * alpha + background * (1.0 - alpha)
            return rgb @ np.array([0.299, 0.587, 0.114]) if grey else rgb  # Pillow's convert("L") weights
    return np.asarray(im.convert("L" if grey else "RGB"), dtype=np.float64) / 255.0


def image_8bit(im, *, grey: bool, background: float = BACKGROUND, name: str = "image"):
    """A Pillow image in mode ``L`` (``grey``) or ``RGB``, converted as :func:`image_array` says; 8-bit images without
    used transparency take Pillow's ``convert`` alone (no float copy)."""
    import numpy as np
    from PIL import Image

    special = im.mode in ("I", "F") or im.mode.startswith("I;16")
    if not special and _transparent(im):
        rgba = im.convert("RGBA")
        special = rgba.getchannel("A").getextrema()[0] < 255
    if not special:
        return im.convert("L" if grey else "RGB")
    return Image.fromarray(np.round(image_array(im, grey=grey, background=background, name=name) * 255.0)
                           .astype(np.uint8))


def read_image(path: str | Path, size: tuple[int, int], *, invert: bool = False,
               background: float = BACKGROUND) -> Tensor:
    """An image file (PNG, JPEG, ... through Pillow, which comes with matplotlib) as grey ``(H, W)`` float in
    [0, 1], resized to ``size`` (bilinear, antialiased). 16-bit, float and transparent images as
    :func:`image_array` says (transparent ones on ``background``, before ``invert``). ``invert`` turns
    dark-on-light pictures into the light-on-dark of (Fashion-)MNIST. Raises ``ValueError`` naming the file when it
    cannot be read."""
    import numpy as np

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} is a folder, not an image file" if path.is_dir() else f"no image file {str(path)!r}")
    try:
        from PIL import Image
    except ImportError as e:  # pragma: no cover - Pillow comes with matplotlib
        raise ImportError("reading images needs Pillow: pip install 'qkv[viz]'") from e
    try:
        with Image.open(path) as im:
            a = image_array(im, grey=True, background=background, name=str(path))
    except Exception as e:  # any decoder error means the same to the user
        raise ValueError(f"cannot read image {str(path)!r}: {e}") from None
    t = torch.from_numpy(np.ascontiguousarray(a)).float()[None, None]
    if tuple(t.shape[-2:]) != tuple(size):
        t = F.interpolate(t, size=tuple(size), mode="bilinear", align_corners=False, antialias=True)
    t = t[0, 0].clamp(0, 1)
    return 1.0 - t if invert else t
