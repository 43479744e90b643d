"""Pictures of semantic segmentation: label maps in colour, and one figure per image with the image, the predicted
labels (and the true ones when known) and the channel weights of BiSeNet's ARMs and FFM for that image.

Example::

    from qkv.apps.segment.pictures import segmentation_figure
    seg = Segmenter.load("runs/segment").predict(["scene.png"])[0]
    segmentation_figure(image, seg.labels, seg.class_names, attention=seg.attention, path="scene-seg.png")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from ...viz.files import save_figure
from ...viz.heatmap import _pyplot
from ...viz.vision import channel_bars, to_image

__all__ = ["label_palette", "colorize", "segmentation_figure"]

IGNORED = (255, 255, 255)  #: the colour of ignored pixels (white)


def label_palette(num_classes: int) -> np.ndarray:
    """``(K, 3)`` uint8 colours: Pascal VOC's palette (class 0 black, 1 dark red, 2 dark green...), whose bits of
    the class number spread over the three channels, so that any number of classes get distinct colours."""
    out = np.zeros((num_classes, 3), dtype=np.uint8)
    for k in range(num_classes):
        c, r, g, b = k, 0, 0, 0
        for shift in range(7, -1, -1):
            r |= ((c >> 0) & 1) << shift
            g |= ((c >> 1) & 1) << shift
            b |= ((c >> 2) & 1) << shift
            c >>= 3
        out[k] = (r, g, b)
    return out


def colorize(labels, num_classes: int, *, ignore_index: int | None = 255) -> np.ndarray:
    """A label map ``(H, W)`` as an ``(H, W, 3)`` uint8 picture in :func:`label_palette`'s colours, ignored pixels
    white; a label outside ``0..K-1`` (not ignored) is a ``ValueError``."""
    a = labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    if a.ndim != 2:
        raise ValueError(f"labels must be (H, W), got shape {a.shape}")
    a = a.astype(np.int64)
    ignored = a == ignore_index if ignore_index is not None else np.zeros(a.shape, dtype=bool)
    bad = ~ignored & ((a < 0) | (a >= num_classes))
    if bad.any():
        raise ValueError(f"label {int(a[bad][0])} outside 0..{num_classes - 1}")
    out = label_palette(num_classes)[np.where(ignored, 0, a)]
    out[ignored] = IGNORED
    return out


def _legend(ax, labels: Sequence[np.ndarray], class_names: Sequence[str]) -> None:
    from matplotlib.patches import Patch

    present = sorted(set().union(*(set(np.unique(a).tolist()) for a in labels)) & set(range(len(class_names))))
    palette = label_palette(len(class_names)) / 255.0
    ax.legend(handles=[Patch(color=palette[k], label=class_names[k]) for k in present], loc="center left",
              bbox_to_anchor=(1.02, 0.5), fontsize=7, frameon=False)


def segmentation_figure(image, labels, class_names: Sequence[str], *, truth=None,
                        attention: Mapping[str, torch.Tensor] | None = None, ignore_index: int | None = 255,
                        title: str | None = None, path: str | Path | None = None):
    """The image, the predicted ``labels (H, W)`` coloured (a legend of the classes shown) and the true labels when
    ``truth`` is given (ignored pixels white) in a row; below them a bar chart of each channel-weight vector of
    ``attention`` (``{"arm16": (C,), "arm32": (C,), "ffm": (C,)}``, in [0, 1]). Saved to ``path`` when given (the
    figure is then closed); returns the figure."""
    plt = _pyplot()
    k = len(class_names)
    shown = [np.asarray(labels.cpu() if isinstance(labels, torch.Tensor) else labels)]
    panels = [("image", to_image(image)), ("predicted", colorize(labels, k, ignore_index=None))]
    if truth is not None:
        panels.append(("true", colorize(truth, k, ignore_index=ignore_index)))
        shown.append(np.asarray(truth.cpu() if isinstance(truth, torch.Tensor) else truth))
    bars = dict(attention or {})
    cols = max(len(panels), len(bars), 1)
    rows = 2 if bars else 1
    fig = plt.figure(figsize=(3.1 * cols + 1.2, 2.9 * rows + (0.3 if title else 0)))
    grid = fig.add_gridspec(rows, cols)
    for j, (name, picture) in enumerate(panels):
        ax = fig.add_subplot(grid[0, j])
        ax.imshow(picture, cmap="gray" if picture.ndim == 2 else None, interpolation="nearest")
        ax.set_title(name, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    _legend(fig.axes[-1], shown, class_names)
    names = {"arm16": "ARM at 1/16", "arm32": "ARM at 1/32", "ffm": "FFM"}
    for j, (name, w) in enumerate(bars.items()):
        w = w.detach().float().cpu().flatten()
        channel_bars(w, ax=fig.add_subplot(grid[1, j]),
                     title=f"{names.get(name, name)}: {w.numel()} channels, mean {float(w.mean()):.2f}")
    if title:
        fig.suptitle(title, fontsize=10)
    if path is not None:
        save_figure(fig, path)
    return fig
