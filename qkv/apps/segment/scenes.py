"""Semantic segmentation data: generated scenes with per-pixel labels, and a reader for a folder of images with
label PNGs (as Pascal VOC or Cityscapes give them).

- :func:`make_segmentation_scenes`: the captioning scenes of :mod:`qkv.data.scenes` (Fashion-MNIST items in the
  cells of a 64x64 canvas), with items of more varied sizes (:data:`SEG_SIZES`, 12 to 32 pixels) and a label map:
  each item's pixels take its class + 1 (background 0), faint pixels of its antialiased border
  (``0 < value <`` :data:`EDGE`) the ignore label, as VOC marks object borders. As for captioning, some
  (item, cell) combinations (:data:`qkv.data.scenes.HELD_OUT`) occur only in the test split.
- :func:`read_label_png`: a label map, an index-coloured PNG: grayscale (8 or 16 bit) or palette (the palette
  index is the class, as VOC's ``SegmentationClass``), with an ignore label (255 by default).
- :func:`read_segmentation_folder`: ``FOLDER/images/NAME.{png,jpg,...}`` with ``FOLDER/labels/NAME.png`` (or VOC's
  ``JPEGImages/`` and ``SegmentationClass/``), either in ``train/``, ``valid/``, ``test/`` subfolders or split by a
  seeded permutation; ``FOLDER/classes.txt`` (one name a line) names the classes. A missing label, a label whose
  size is not its image's, a label above the class count or a file that is not a readable PNG is a ``ValueError``
  naming the file, or (``on_error="skip"``) counted and skipped.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ...data.scenes import _SPLITS, CANVAS, CELL, CELLS, HELD_OUT, _item_pools, _paste

logger = logging.getLogger(__name__)

__all__ = ["SegmentationSplit", "SegmentationData", "make_segmentation_scenes", "read_label_png", "read_image_pair",
           "read_segmentation_folder", "IGNORE", "EDGE", "SEG_SIZES", "IMAGE_SUFFIXES"]

IGNORE = 255  #: the default ignore label (VOC's border and "void")
EDGE = 8  #: an item's pixels fainter than this grey level (of 255), its antialiased halo, are ignored
SEG_SIZES = (12, 32)  #: item sides in the segmentation scenes, inclusive
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
_LAYOUTS = (("images", "labels"), ("JPEGImages", "SegmentationClass"))


@dataclass
class SegmentationSplit:
    """``images (N, C, H, W)`` uint8, ``labels (N, H, W)`` uint8 (class numbers, ``ignore_index`` not scored),
    the images' ``names`` and (scenes) which hold a held-out (item, cell) combination."""

    images: Tensor
    labels: Tensor
    names: list[str]
    held_out: Tensor | None = None

    def __len__(self) -> int:
        return len(self.names)

    def head(self, n: int | None) -> SegmentationSplit:
        """The first ``n`` examples (all with ``None``)."""
        held = None if self.held_out is None else self.held_out[:n]
        return SegmentationSplit(self.images[:n], self.labels[:n], self.names[:n], held)


@dataclass
class SegmentationData:
    """``{"train", "valid", "test": SegmentationSplit}``, the class names (class ``k`` is ``class_names[k]``), the
    ignore label, where the data came from and how many pairs were skipped (``on_error="skip"``)."""

    splits: dict[str, SegmentationSplit]
    class_names: list[str]
    ignore_index: int = IGNORE
    source: str = ""
    skipped: int = 0
    channels: int = field(init=False)

    def __post_init__(self):
        self.channels = int(self.splits["train"].images.shape[1])


# --- generated scenes ------------------------------------------------------------------------------------------

def _scene(rng: np.random.Generator, pool: list[Tensor], n_classes: int, allow_held_out: bool, sizes: tuple[int, int],
           ignore_index: int) -> tuple[Tensor, Tensor, bool]:
    """One canvas, its label map and whether it holds a held-out combination (the captioning scenes' draw, with
    item sizes from ``sizes``)."""
    n = int(rng.integers(1, len(CELLS) + 1))
    cells = sorted(CELLS[i] for i in rng.choice(len(CELLS), size=n, replace=False))
    classes: list[int] = []
    for cell in cells:
        choices = [k for k in range(n_classes) if k not in classes and (allow_held_out or (k, cell) not in HELD_OUT)]
        classes.append(int(rng.choice(choices)))
    canvas = torch.zeros(CANVAS, CANVAS)
    labels = torch.zeros(CANVAS, CANVAS, dtype=torch.uint8)
    for k, (r, c) in zip(classes, cells, strict=True):
        size = int(rng.integers(sizes[0], sizes[1] + 1))
        y = r * CELL + int(rng.integers(0, CELL - size + 1))
        x = c * CELL + int(rng.integers(0, CELL - size + 1))
        picture = pool[k][int(rng.integers(len(pool[k])))]
        item = torch.zeros(CANVAS, CANVAS)
        _paste(item, picture, size, y, x)
        torch.maximum(canvas, item, out=canvas)
        labels[item >= EDGE] = k + 1
        labels[(item > 0) & (item < EDGE)] = ignore_index
    held = any((k, cell) in HELD_OUT for k, cell in zip(classes, cells, strict=True))
    return canvas.to(torch.uint8), labels, held


def make_segmentation_scenes(n_train: int = 10_000, n_valid: int = 500, n_test: int = 1_000, *, seed: int = 0,
                             root: str | None = None, sizes: tuple[int, int] = SEG_SIZES,
                             ignore_index: int = IGNORE) -> SegmentationData:
    """The three splits of labelled scenes (see the module docstring); classes ``background`` and the item words.
    ``root``: a Fashion-MNIST IDX folder (default: Debian's, else scikit-learn digits). Scene ``i`` of a split is
    a function of ``(seed, split, i)``."""
    for name, n in (("n_train", n_train), ("n_valid", n_valid), ("n_test", n_test)):
        if n < 1:
            raise ValueError(f"{name} must be at least 1, got {n}")
    if not 1 <= sizes[0] <= sizes[1] <= CELL:
        raise ValueError(f"item sizes must be within 1..{CELL}, got {sizes}")
    pools, words, source = _item_pools(root)
    splits = {}
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        images, labels, held = [], [], []
        for i in range(n):
            rng = np.random.default_rng([seed, _SPLITS[split], i, 1])  # 1: not the captioning scenes' draws
            image, label, h = _scene(rng, pools[split], len(words), split == "test", sizes, ignore_index)
            images.append(image)
            labels.append(label)
            held.append(h)
        splits[split] = SegmentationSplit(torch.stack(images)[:, None], torch.stack(labels),
                                          [f"{split}{i}" for i in range(n)], torch.tensor(held))
    return SegmentationData(splits, ["background", *words], ignore_index, f"scenes of {source}")


# --- a folder of images and label PNGs ---------------------------------------------------------------------------

def _open(path: Path):
    from PIL import Image

    if not path.is_file():
        raise ValueError(f"{path}: {'a folder, not an image file' if path.is_dir() else 'no such file'}")
    im = Image.open(path)
    im.load()
    return im


def read_label_png(path: str | Path, *, num_classes: int | None = None, ignore_index: int = IGNORE) -> Tensor:
    """A label map ``(H, W)`` int64 from an index-coloured PNG: grayscale (``L``, ``I;16``, ``I``, 1-bit) or palette
    (``P``: the palette index is the label). Raises ``ValueError`` naming the file for a file that is not a
    readable PNG, a colour PNG (RGB/RGBA: colours must be turned into indices first), or (``num_classes``) a label
    at or above ``num_classes`` that is not ``ignore_index``."""
    path = Path(path)
    try:
        with _open(path) as im:
            if im.format != "PNG":
                raise ValueError(f"{path}: a {im.format} file, not a PNG (label maps are PNGs: JPEG would blur them)")
            if im.mode not in ("P", "L", "1", "I", "I;16", "I;16B", "I;16L"):
                raise ValueError(f"{path}: a {im.mode} PNG; label maps are index-coloured (grayscale or palette) "
                                 "PNGs whose pixel values are the classes")
            a = np.array(im, dtype=np.int64)
    except ValueError:
        raise
    except Exception as e:  # any decoder error (truncated, bad CRC, not an image) means the same to the user
        raise ValueError(f"{path}: not a readable PNG ({e})") from None
    if num_classes is not None:
        bad = (a >= num_classes) & (a != ignore_index) | (a < 0)
        if bad.any():
            y, x = (int(v) for v in np.argwhere(bad)[0])
            raise ValueError(f"{path}: label {int(a[y, x])} at pixel (y={y}, x={x}) but there are {num_classes} "
                             f"classes (0-{num_classes - 1}; {ignore_index} is ignored)")
    return torch.from_numpy(a)


def read_image_pair(image: str | Path, label: str | Path, *, grey: bool = False, num_classes: int | None = None,
                    ignore_index: int = IGNORE) -> tuple[Tensor, Tensor]:
    """An image ``(C, H, W)`` uint8 (``C`` = 1 for ``grey``, else 3) and its label map ``(H, W)`` int64 of the same
    size (``ValueError`` naming the files otherwise)."""
    from ...data.images import image_8bit

    image, label = Path(image), Path(label)
    if not label.is_file():
        raise ValueError(f"{image}: no label PNG {label}")
    try:
        with _open(image) as im:
            pic = np.array(image_8bit(im, grey=grey, name=str(image)))
    except ValueError:
        raise
    except Exception as e:
        raise ValueError(f"{image}: not a readable image ({e})") from None
    labels = read_label_png(label, num_classes=num_classes, ignore_index=ignore_index)
    if tuple(labels.shape) != pic.shape[:2]:
        raise ValueError(f"{label}: {labels.shape[1]}x{labels.shape[0]} pixels but its image {image} is "
                         f"{pic.shape[1]}x{pic.shape[0]}")
    x = torch.from_numpy(pic)
    return (x[None] if grey else x.permute(2, 0, 1)).contiguous(), labels


def _layout(folder: Path) -> tuple[Path, Path]:
    for images, labels in _LAYOUTS:
        if (folder / images).is_dir():
            return folder / images, folder / labels
    raise ValueError(f"{folder}: no images/ folder (with labels/ beside it) nor VOC's JPEGImages/ and "
                     "SegmentationClass/")


def _pairs(folder: Path) -> list[tuple[Path, Path]]:
    images, labels = _layout(folder)
    files = sorted(p for p in images.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ValueError(f"{images}: no images ({', '.join(IMAGE_SUFFIXES)})")
    return [(p, labels / f"{p.stem}.png") for p in files]


def _resize(x: Tensor, labels: Tensor, size: int | None) -> tuple[Tensor, Tensor]:
    if size is None or tuple(x.shape[-2:]) == (size, size):
        return x, labels
    x = F.interpolate(x[None].float(), size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    labels = F.interpolate(labels[None, None].float(), size=(size, size), mode="nearest")
    return x[0].round().clamp(0, 255).to(torch.uint8), labels[0, 0].long()


def _read_split(pairs: list[tuple[Path, Path]], *, grey: bool, size: int | None, num_classes: int | None,
                ignore_index: int, on_error: str) -> tuple[list, list, list, int]:
    images, labels, names, skipped = [], [], [], 0
    for image, label in pairs:
        try:
            x, y = read_image_pair(image, label, grey=grey, num_classes=num_classes, ignore_index=ignore_index)
            if int(y.max()) > 255:
                raise ValueError(f"{label}: label {int(y.max())}; label maps hold at most 255 classes (0-254)")
        except ValueError as e:
            if on_error != "skip":
                raise
            skipped += 1
            logger.warning("skipped: %s", e)
            continue
        x, y = _resize(x, y, size)
        images.append(x)
        labels.append(y.to(torch.uint8))
        names.append(image.stem)
    return images, labels, names, skipped


def _class_names(folder: Path, num_classes: int | None) -> list[str] | None:
    path = folder / "classes.txt"
    if not path.is_file():
        return None if num_classes is None else [str(k) for k in range(num_classes)]
    names = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if num_classes is not None and len(names) != num_classes:
        raise ValueError(f"{path}: {len(names)} class names but num_classes is {num_classes}")
    if not names:
        raise ValueError(f"{path}: no class names")
    return names


def read_segmentation_folder(folder: str | Path, *, image_size: int | None = 128, grey: bool = False,
                             valid: float = 0.1, test: float = 0.1, seed: int = 0, num_classes: int | None = None,
                             ignore_index: int = IGNORE, on_error: str = "raise") -> SegmentationData:
    """The splits of a folder of images and label PNGs (see the module docstring), every image and label resized
    to ``image_size`` x ``image_size`` (labels by nearest neighbour; ``None``: all images must have one size).
    Classes: ``classes.txt``, else ``num_classes``, else the largest label seen + 1."""
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder}: no such folder (data is 'scenes' or a folder of images and label PNGs)")
    names = _class_names(folder, num_classes)
    k = None if names is None else len(names)
    if (folder / "train").is_dir():
        given = {s: _pairs(folder / s) for s in ("train", "valid", "test") if (folder / s).is_dir()}
        if "test" not in given:
            raise ValueError(f"{folder}: a train/ folder but no test/ folder")
        if "valid" not in given:  # the last share of train
            cut = len(given["train"]) - max(1, math.floor(valid * len(given["train"])))
            given["train"], given["valid"] = given["train"][:cut], given["train"][cut:]
    else:
        pairs = _pairs(folder)
        order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed)).tolist()
        n_valid, n_test = math.floor(valid * len(pairs)), math.floor(test * len(pairs))
        given = {"valid": [pairs[i] for i in order[:n_valid]],
                 "test": [pairs[i] for i in order[n_valid:n_valid + n_test]],
                 "train": [pairs[i] for i in order[n_valid + n_test:]]}
    read, skipped = {}, 0
    for split in ("train", "valid", "test"):
        images, labels, stems, s = _read_split(given[split], grey=grey, size=image_size, num_classes=k,
                                               ignore_index=ignore_index, on_error=on_error)
        skipped += s
        read[split] = (images, labels, stems)
    counts = {s: len(v[2]) for s, v in read.items()}
    if min(counts.values()) < 1:
        raise ValueError(f"{folder}: splits of {counts['train']} train, {counts['valid']} valid and {counts['test']} "
                         f"test pairs{f' ({skipped} skipped)' if skipped else ''}; each needs at least one (give more "
                         "pairs, or larger valid/test shares)")
    sizes = {tuple(x.shape) for v in read.values() for x in v[0]}
    if len(sizes) > 1:
        raise ValueError(f"{folder}: images of several sizes {sorted(sizes)[:3]}: give an image size to resize them to")
    if names is None:
        top = max(int(y[y != ignore_index].max()) if (y != ignore_index).any() else 0
                  for v in read.values() for y in v[1])
        names = [str(c) for c in range(top + 1)]
    if len(names) < 2:
        raise ValueError(f"{folder}: one class only ({names[0]}); segmentation needs two or more")
    splits = {s: SegmentationSplit(torch.stack(v[0]), torch.stack(v[1]), v[2]) for s, v in read.items()}
    if skipped:
        logger.warning("%s: skipped %d image/label pairs that could not be read", folder, skipped)
    return SegmentationData(splits, names, ignore_index, str(folder), skipped)
