"""Generated captioning scenes: 1-4 Fashion-MNIST items on a 64x64 canvas, captions that name every item and its
position or relation, and every item's bounding box.

The canvas is a 2x2 grid of 32x32 cells; each item (a Fashion-MNIST picture, scaled to 24-32 pixels) sits at a
random place inside its own cell, so "top left", "left of" and "above" are well defined, and a feature grid of
8x8 cells (a CNN with stride 8) has 4x4 cells per scene cell. Items of one scene are of distinct classes, from six
classes a small CNN tells apart well (Xiao et al.'s hardest ones, shirt / pullover / coat, are left out: exact
captions of four items need every item right).

Every scene has up to three references (duplicates removed), e.g. for a bag at the top left and a boot at the
bottom right:

- ``a bag at the top left and a boot at the bottom right`` (items in reading order, rows first);
- the same with the items in column order (differs when the scene has items in both columns and rows);
- ``a bag on the left above a boot on the right`` (rows: ``a X left of a Y`` / ``a X on the left``, joined by
  ``above``; a single row ends ``at the top`` / ``at the bottom``).

Splits: ``train`` and ``valid`` scenes take their items from disjoint parts of the Fashion-MNIST training images,
``test`` scenes from its test images. Some (class, cell) combinations (one cell per class) never occur in train
or valid and occur in test, so memorising captions cannot pass. Scene ``i`` of a split is a function of
``(seed, split, i)`` alone. Without Fashion-MNIST (Debian's ``dataset-fashion-mnist``), scikit-learn's digits are
the items (six digit classes, named ``zero`` ...).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

logger = logging.getLogger(__name__)

__all__ = ["Scene", "SceneSplit", "SceneData", "make_scenes", "scene_captions", "CANVAS", "GRID", "CELLS",
           "FASHION_ITEMS", "DIGIT_ITEMS", "HELD_OUT", "POSITION_WORDS", "RELATION_WORDS"]

CANVAS = 64  #: canvas side, pixels
GRID = 2  #: cells per side
CELL = CANVAS // GRID
CELLS = tuple((r, c) for r in range(GRID) for c in range(GRID))  #: (row, column), reading order
SIZES = (24, 32)  #: item sides, inclusive range
#: Fashion-MNIST class index -> the word of the captions (six classes a small CNN tells apart)
FASHION_ITEMS = {0: "shirt", 1: "trouser", 3: "dress", 5: "sandal", 8: "bag", 9: "boot"}
DIGIT_ITEMS = {0: "zero", 1: "one", 2: "two", 3: "three", 4: "four", 7: "seven"}
#: (item number in the class list, cell) combinations of the test split only: item k at cell k mod 4
HELD_OUT = frozenset((k, CELLS[k % len(CELLS)]) for k in range(6))
_POSITION = {(0, 0): "top left", (0, 1): "top right", (1, 0): "bottom left", (1, 1): "bottom right"}
POSITION_WORDS = frozenset({"top", "bottom", "left", "right"})
RELATION_WORDS = frozenset({"above", "left", "of", "on"})
_SPLITS = {"train": 0, "valid": 1, "test": 2}


@dataclass
class Scene:
    """One scene: ``items`` (class words), their ``cells`` ``(row, col)`` and ``boxes`` ``(y0, x0, y1, x1)``
    in pixels (end exclusive), in reading order of the cells; its reference ``captions``."""

    items: list[str]
    cells: list[tuple[int, int]]
    boxes: list[tuple[int, int, int, int]]
    captions: list[str]
    held_out: bool = False  #: holds a (class, cell) combination that training never sees (:data:`HELD_OUT`)


@dataclass
class SceneSplit:
    """A split's canvases ``images (N, 64, 64)`` uint8 and its :class:`Scene` descriptions."""

    images: Tensor
    scenes: list[Scene]

    def __len__(self) -> int:
        return len(self.scenes)


@dataclass
class SceneData:
    """``{split: SceneSplit}`` and the item words, in class order."""

    splits: dict[str, SceneSplit]
    item_words: list[str]
    source: str  #: where the item pictures came from


def _row(words: list[str], cols: list[int]) -> str:
    if len(words) == 2:
        return f"a {words[0]} left of a {words[1]}"
    return f"a {words[0]} on the {'left' if cols[0] == 0 else 'right'}"


def _listing(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else " , ".join(parts[:-1]) + " and " + parts[-1]


def scene_captions(items: list[str], cells: list[tuple[int, int]]) -> list[str]:
    """The references of a scene whose ``items`` sit at ``cells`` (any order): positions in reading order, in
    column order, and the rows' relations; duplicates removed.

    >>> scene_captions(["bag", "boot"], [(0, 0), (1, 1)])[2]
    'a bag on the left above a boot on the right'
    """
    order = sorted(range(len(items)), key=lambda i: cells[i])
    by_col = sorted(range(len(items)), key=lambda i: (cells[i][1], cells[i][0]))
    refs = [_listing([f"a {items[i]} at the {_POSITION[cells[i]]}" for i in o]) for o in (order, by_col)]
    rows = [[i for i in order if cells[i][0] == r] for r in range(GRID)]
    described = [_row([items[i] for i in row], [cells[i][1] for i in row]) for row in rows if row]
    if rows[0] and rows[1]:
        refs.append(f"{described[0]} above {described[1]}")
    else:
        refs.append(f"{described[0]} at the {'top' if rows[0] else 'bottom'}")
    return list(dict.fromkeys(refs))


def _item_pools(root: str | None) -> tuple[dict[str, list[Tensor]], list[str], str]:
    """Pictures of every item class for train, valid and test: ``({split: [per class (n, h, w) uint8]}, words)``."""
    from .idx import FASHION_MNIST_ROOT, load_fashion_mnist

    folder = Path(root or FASHION_MNIST_ROOT)
    if folder.is_dir() and any(folder.iterdir()):
        train_x, train_y = load_fashion_mnist(folder, "train")
        test_x, test_y = load_fashion_mnist(folder, "test")
        items, source = FASHION_ITEMS, f"fashion-mnist ({folder})"
    elif root:
        raise FileNotFoundError(f"no Fashion-MNIST IDX files in {root} (scenes_root)")
    else:
        from .images import load_digits_images

        logger.warning("%s not found: scenes of scikit-learn digits instead of Fashion-MNIST", folder)
        x, y = load_digits_images()
        g = torch.Generator().manual_seed(12345)
        perm = torch.randperm(len(y), generator=g)
        cut = int(0.8 * len(y))
        train_x, train_y, test_x, test_y = x[perm[:cut]], y[perm[:cut]], x[perm[cut:]], y[perm[cut:]]
        items, source = DIGIT_ITEMS, "scikit-learn digits"
    pools: dict[str, list[Tensor]] = {"train": [], "valid": [], "test": []}
    for label in items:
        own = train_x[train_y == label]
        n_valid = max(1, len(own) // 10)  # the last tenth of each class's training pictures for validation
        pools["train"].append(own[:-n_valid])
        pools["valid"].append(own[-n_valid:])
        pools["test"].append(test_x[test_y == label])
    return pools, list(items.values()), source


def _paste(canvas: Tensor, picture: Tensor, size: int, y: int, x: int) -> None:
    t = picture.float()[None, None]
    t = F.interpolate(t, size=(size, size), mode="bilinear", align_corners=False, antialias=True)[0, 0]
    region = canvas[y:y + size, x:x + size]
    torch.maximum(region, t.round().clamp(0, 255), out=region)


def _scene(rng: np.random.Generator, pool: list[Tensor], words: list[str], allow_held_out: bool
           ) -> tuple[Tensor, Scene]:
    n = int(rng.integers(1, len(CELLS) + 1))
    cells = sorted(CELLS[i] for i in rng.choice(len(CELLS), size=n, replace=False))
    classes: list[int] = []
    for cell in cells:
        choices = [k for k in range(len(words)) if k not in classes and (allow_held_out or (k, cell) not in HELD_OUT)]
        classes.append(int(rng.choice(choices)))
    canvas = torch.zeros(CANVAS, CANVAS)
    boxes = []
    for k, (r, c) in zip(classes, cells, strict=True):
        size = int(rng.integers(SIZES[0], SIZES[1] + 1))
        y = r * CELL + int(rng.integers(0, CELL - size + 1))
        x = c * CELL + int(rng.integers(0, CELL - size + 1))
        picture = pool[k][int(rng.integers(len(pool[k])))]
        _paste(canvas, picture, size, y, x)
        boxes.append((y, x, y + size, x + size))
    items = [words[k] for k in classes]
    held_out = any((k, cell) in HELD_OUT for k, cell in zip(classes, cells, strict=True))
    return canvas.to(torch.uint8), Scene(items, cells, boxes, scene_captions(items, cells), held_out)


def make_scenes(n_train: int = 10_000, n_valid: int = 500, n_test: int = 1_000, *, seed: int = 0,
                root: str | None = None) -> SceneData:
    """Generate the three splits (see the module docstring); ``root``: a Fashion-MNIST IDX folder (default:
    Debian's, else scikit-learn digits). Deterministic in ``seed``."""
    for name, n in (("n_train", n_train), ("n_valid", n_valid), ("n_test", n_test)):
        if n < 1:
            raise ValueError(f"{name} must be at least 1, got {n}")
    pools, words, source = _item_pools(root)
    splits = {}
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        images, scenes = [], []
        for i in range(n):
            rng = np.random.default_rng([seed, _SPLITS[split], i])
            image, scene = _scene(rng, pools[split], words, allow_held_out=split == "test")
            images.append(image)
            scenes.append(scene)
        splits[split] = SceneSplit(torch.stack(images), scenes)
    return SceneData(splits, words, source)
