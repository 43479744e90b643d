"""The picture of Show, Attend and Tell (Xu et al., 2015, Fig. 2-3): the image, then one panel per generated word
with the attention map it was produced with, upsampled to the image and overlaid (matplotlib, the ``viz`` extra).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from torch import Tensor

from ...viz.heatmap import _pyplot
from ...viz.vision import overlay, save_figure, to_image

__all__ = ["caption_attention"]


def caption_attention(image: Tensor, words: Sequence[str], attention: Tensor, *,
                      boxes: Sequence[tuple[str, Sequence[float]]] | None = None, columns: int = 6,
                      title: str | None = None, path: str | Path | None = None):
    """Draw ``image`` (``(C, H, W)`` or ``(H, W)``, uint8 or [0, 1]) and, for every word, ``attention[t] (h, w)``
    upsampled and overlaid, the word as the panel's title; ``boxes``: ``[(item word, (y0, x0, y1, x1))]`` drawn on
    the panels of the words naming them. Returns the saved path (``path``) or the figure."""
    import numpy as np
    from matplotlib.patches import Rectangle

    if attention.dim() != 3 or attention.shape[0] != len(words):
        raise ValueError(f"attention must be (T={len(words)}, h, w), one map per word, got {tuple(attention.shape)}")
    if columns < 1:
        raise ValueError(f"columns must be positive, got {columns}")
    img = image.detach().float().cpu()
    if img.max() > 1.0:
        img = img / 255.0
    if img.dim() == 3:
        img = img[0] if img.shape[0] == 1 else img.permute(1, 2, 0)
    arr = to_image(img.numpy())
    plt = _pyplot()
    n = len(words) + 1
    cols = min(columns, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(1.9 * cols, 2.0 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    first = axes.flat[0]
    first.imshow(arr, cmap="gray" if arr.ndim == 2 else None, vmin=0.0, vmax=1.0)
    first.set_title(title or "image", fontsize=9)
    named = {w: b for w, b in boxes or []}
    for t, word in enumerate(words):
        ax = axes.flat[t + 1]
        overlay(arr, attention[t].float().cpu().numpy().astype(np.float64), ax=ax, title=word, colorbar=False,
                vmin=0.0)
        if word in named:
            y0, x0, y1, x1 = named[word]
            ax.add_patch(Rectangle((x0 - 0.5, y0 - 0.5), x1 - x0, y1 - y0, fill=False, edgecolor="white", lw=1.2))
        ax.axis("off")
    if path is None:
        return fig
    return save_figure(fig, path)
