"""Pictures of image attention: spatial maps over the image, channel weights, SK branch weights, non-local maps.

Every function draws one panel into ``ax`` (a new figure when ``None``), saves it to ``path`` when given
(PNG, SVG or PDF by extension) and returns the ``Axes``. Inputs are tensors or arrays; a map smaller than
its image is upsampled to the image's size (bilinear, pixel centres aligned) before it is drawn.

Example::

    from qkv.viz.vision import overlay, channel_bars
    out, maps = model(x, return_attention=True)            # CBAM: maps["stage2"].spatial (B, 1, 14, 14)
    overlay(x[0, 0], maps["stage2"].spatial[0, 0], path="where.png")
    channel_bars(maps["stage2"].channel[0].flatten(), path="what.png")
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .files import save_figure
from .heatmap import _pyplot

logger = logging.getLogger(__name__)

__all__ = ["to_image", "upsample_map", "overlay", "channel_bars", "branch_weights", "query_map", "save_figure"]


def _array(x, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be a tensor or an array of numbers: {e}") from None


def to_image(image) -> np.ndarray:
    """``(H, W)``, ``(1, H, W)``, ``(3, H, W)``, ``(H, W, 1)`` or ``(H, W, 3)`` -> a displayable ``(H, W)`` grey or
    ``(H, W, 3)`` colour array, rescaled to [0, 1] (each image by its own minimum and maximum)."""
    a = _array(image, "image")
    if a.ndim == 3 and a.shape[0] in (1, 3) and a.shape[-1] not in (1, 3):
        a = np.moveaxis(a, 0, -1)
    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    if not (a.ndim == 2 or a.ndim == 3 and a.shape[-1] == 3):
        raise ValueError(f"image must be (H, W), (C, H, W) or (H, W, C) with C = 1 or 3, got shape {a.shape}")
    lo, hi = float(a.min()), float(a.max())
    return (a - lo) / (hi - lo) if hi > lo else np.zeros_like(a)


def upsample_map(attention, size: tuple[int, int]) -> np.ndarray:
    """A map ``(h, w)`` (or ``(1, h, w)``) upsampled bilinearly to ``size = (H, W)``."""
    a = _array(attention, "attention")
    if a.ndim == 3 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 2:
        raise ValueError(f"a spatial map must be (h, w), got shape {a.shape}")
    if a.shape == tuple(size):
        return a
    t = torch.from_numpy(a)[None, None]
    return F.interpolate(t, size=tuple(size), mode="bilinear", align_corners=False)[0, 0].numpy()


def _axes(ax, figsize):
    plt = _pyplot()
    if ax is None:
        _, ax = plt.subplots(figsize=figsize)
        return ax, True
    return ax, False


def _finish(ax, own: bool, path, what: str):
    if path is not None:
        save_figure(ax.figure, path, close=own)
        logger.info("saved %s to %s", what, path)
    return ax




def overlay(image, attention, *, ax=None, title: str | None = None, alpha: float = 0.5, cmap: str = "jet",
            vmin: float | None = None, vmax: float | None = None, colorbar: bool = True,
            path: str | Path | None = None):
    """Draw ``attention (h, w)`` upsampled to the image's size, translucent over ``image`` (see :func:`to_image`).

    The colour scale runs from ``vmin`` to ``vmax`` (default: the map's own minimum and maximum).
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    img = to_image(image)
    heat = upsample_map(attention, img.shape[:2])
    ax, own = _axes(ax, (3.2, 3.0))
    ax.imshow(img, cmap="gray" if img.ndim == 2 else None, vmin=0.0, vmax=1.0)
    lo = float(heat.min()) if vmin is None else vmin
    hi = float(heat.max()) if vmax is None else vmax
    im = ax.imshow(heat, cmap=cmap, alpha=alpha, vmin=lo, vmax=hi if hi > lo else lo + 1e-12)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=9)
    return _finish(ax, own, path, "attention overlay")


def channel_bars(weights, *, ax=None, title: str | None = None, sort: bool = False, ylim: tuple | None = (0.0, 1.0),
                 path: str | Path | None = None):
    """Bars of channel weights ``(C,)`` (any shape with ``C`` elements, e.g. SE's ``(C, 1, 1)``), in channel order
    or, with ``sort``, largest first. ``ylim=None`` scales the axis to the data (for ungated weights)."""
    w = _array(weights, "weights").reshape(-1)
    if w.size == 0:
        raise ValueError("channel_bars needs at least one weight")
    if sort:
        w = np.sort(w)[::-1]
    ax, own = _axes(ax, (max(3.0, min(10.0, 0.06 * w.size + 2.0)), 2.4))
    ax.bar(np.arange(w.size), w, width=1.0, color="tab:blue", linewidth=0)
    ax.set_xlim(-0.5, w.size - 0.5)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.set_xlabel("channel (sorted)" if sort else "channel")
    ax.set_ylabel("weight")
    ax.set_title(title or f"{w.size} channels: mean {w.mean():.2f}, min {w.min():.2f}, max {w.max():.2f}", fontsize=9)
    return _finish(ax, own, path, "channel weights")


def branch_weights(weights, *, labels: Sequence[str] | None = None, ax=None, title: str | None = None,
                   path: str | Path | None = None):
    """Selective-kernel branch weights ``(M, C)`` (softmax over the ``M`` branches, per channel): one row per
    branch, one column per channel, each row labelled with its mean weight."""
    w = _array(weights, "weights")
    if w.ndim == 1:
        w = w[:, None]
    if w.ndim != 2:
        raise ValueError(f"branch weights must be (M, C), got shape {w.shape}")
    m = w.shape[0]
    labels = [f"branch {i + 1}" for i in range(m)] if labels is None else list(labels)
    if len(labels) != m:
        raise ValueError(f"{len(labels)} labels for {m} branches")
    ax, own = _axes(ax, (max(3.0, min(10.0, 0.06 * w.shape[1] + 2.5)), 0.5 * m + 1.4))
    im = ax.imshow(w, aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    ax.set_yticks(range(m), labels=[f"{lab} ({row.mean():.2f})" for lab, row in zip(labels, w, strict=True)])
    ax.set_xlabel("channel")
    if title:
        ax.set_title(title, fontsize=9)
    return _finish(ax, own, path, "branch weights")


def query_map(image, weights, query: tuple[int, int], *, key_shape: tuple[int, int],
              query_shape: tuple[int, int] | None = None, ax=None, title: str | None = None, alpha: float = 0.5,
              path: str | Path | None = None):
    """The non-local attention of one query position over the keys, on the image.

    Args:
        image: the input image (see :func:`to_image`).
        weights: ``(HW')`` the query's row of the attention, or ``(HW, HW')`` the whole matrix (then the row of
            ``query`` is taken, which needs ``query_shape``).
        query: ``(y, x)`` of the query in image pixels; marked with a cross.
        key_shape: ``(h', w')`` of the key grid (``HW' = h' w'``).
        query_shape: ``(h, w)`` of the query grid, for a whole matrix.
    """
    img = to_image(image)
    big_h, big_w = img.shape[:2]
    qy, qx = query
    if not (0 <= qy < big_h and 0 <= qx < big_w):
        raise ValueError(f"query pixel {tuple(query)} is outside the {big_h}x{big_w} image")
    w = _array(weights, "weights")
    if w.ndim == 2:
        if query_shape is None or query_shape[0] * query_shape[1] != w.shape[0]:
            raise ValueError(f"a whole (HW, HW') matrix {w.shape} needs query_shape (h, w) with h * w = {w.shape[0]}")
        h, wd = query_shape
        w = w[(qy * h // big_h) * wd + qx * wd // big_w]
    if w.ndim != 1 or w.size != key_shape[0] * key_shape[1]:
        raise ValueError(f"weights of shape {w.shape} do not fill key_shape {tuple(key_shape)}")
    ax, own = _axes(ax, (3.2, 3.0))
    overlay(img, w.reshape(key_shape), ax=ax, title=title, alpha=alpha)
    ax.plot([qx], [qy], marker="x", color="white", markersize=9, markeredgewidth=2.5)
    ax.plot([qx], [qy], marker="x", color="black", markersize=7, markeredgewidth=1.2)
    return _finish(ax, own, path, "non-local query map")
