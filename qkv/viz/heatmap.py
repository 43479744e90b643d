"""Attention weights as an annotated heatmap, queries as rows and keys as columns."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

# fonts tried in order so that CJK labels render (Noto/WenQuanYi/Droid where installed, else DejaVu)
CJK_FONTS = ["Noto Sans CJK JP", "Noto Sans CJK SC", "WenQuanYi Zen Hei", "Droid Sans Fallback", "AR PL UMing CN",
             "DejaVu Sans"]


# CJK font files that matplotlib's cached font list may not know yet (installed after its cache was built)
_CJK_FILES = ("/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc", "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
              "/usr/share/fonts/truetype/droid/DroidSansFallbackFull.ttf")


@functools.cache
def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
        from matplotlib import font_manager
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("plots need matplotlib: pip install 'qkv[viz]'") from e
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)  # "weight normal ... using 500" noise
    known = {f.fname for f in font_manager.fontManager.ttflist}
    for path in _CJK_FILES:
        if os.path.exists(path) and path not in known:
            font_manager.fontManager.addfont(path)
    plt.rcParams["font.family"] = "sans-serif"
    plt.rcParams["font.sans-serif"] = CJK_FONTS + [f for f in plt.rcParams["font.sans-serif"] if f not in CJK_FONTS]
    return plt


def heatmap(weights, *, x_labels: Sequence[str] | None = None, y_labels: Sequence[str] | None = None,
            title: str | None = None, annotate: bool | None = None, xlabel: str = "key",
            ylabel: str = "query", path: str | Path | None = None, ax=None):
    """Draw ``weights (Tq, Tk)``; annotate cells with their values when small (<= 12x12 by default).

    Saves to ``path`` (PNG, SVG or PDF by extension) when given. Returns the matplotlib ``Axes``.
    """
    import numpy as np

    plt = _pyplot()
    w = weights.detach().cpu().double().numpy() if hasattr(weights, "detach") else np.asarray(weights, float)
    if w.ndim != 2:
        raise ValueError(f"heatmap needs a (Tq, Tk) matrix, got shape {w.shape}")
    for name, labels, n in (("x_labels", x_labels, w.shape[1]), ("y_labels", y_labels, w.shape[0])):
        if labels is not None and len(labels) != n:
            raise ValueError(f"{name} has {len(labels)} entries for {n} columns/rows of weights {w.shape}")
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(1.0 + 0.45 * max(w.shape[1], 4), 1.0 + 0.45 * max(w.shape[0], 4)))
    im = ax.imshow(w, cmap="viridis", vmin=0.0, vmax=max(1e-12, float(w.max())), aspect="auto")
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xticks(range(w.shape[1]), labels=list(x_labels) if x_labels is not None else None)
    ax.set_yticks(range(w.shape[0]), labels=list(y_labels) if y_labels is not None else None)
    if x_labels is not None:
        ax.tick_params(axis="x", labelrotation=90)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if annotate if annotate is not None else max(w.shape) <= 12:
        for i in range(w.shape[0]):
            for j in range(w.shape[1]):
                ax.text(j, i, f"{w[i, j]:.2f}", ha="center", va="center",
                        color="black" if w[i, j] > 0.6 * w.max() else "white", fontsize=8)
    if path is not None:
        from .files import save_figure

        written = save_figure(ax.figure, path, close=own, dpi=150)
        logger.info("saved heatmap to %s", written)
    return ax
