"""The applications' pictures, from plain tensors: a translation's alignment, metric curves, and every attention map
of an image model on one image.

- :func:`alignment`: target tokens (rows) x source tokens (columns), spaces shown as ``␣``.
- :func:`line_chart`: named series over shared categories (e.g. BLEU by source length, one line per model).
- :func:`image_attention`: PNGs of an image's spatial maps, channel weights, SK branch weights and the non-local
  attention of a query pixel (each only when there are such maps).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from torch import Tensor

from .heatmap import _pyplot, heatmap
from .vision import branch_weights, channel_bars, overlay, query_map, save_figure

__all__ = ["alignment", "line_chart", "image_attention", "visible_tokens"]


def visible_tokens(tokens: Sequence[str]) -> list[str]:
    """Tokens as labels: a token made of spaces (invisible) is drawn as ``␣``."""
    return [t.replace(" ", "␣") if t.strip() == "" else t for t in tokens]


def alignment(attention, source_tokens: Sequence[str], target_tokens: Sequence[str], *, path: str | Path | None = None,
              title: str | None = None, end_token: str = "</s>"):
    """Heatmap of a translation's attention ``(T, S)``: a row per target token (plus ``end_token`` when the
    attention has one more row, the step that chose the end), a column per source token. Returns the ``Axes``."""
    ys = list(target_tokens) + ([end_token] if attention.shape[0] > len(target_tokens) else [])
    return heatmap(attention[: len(ys)], x_labels=visible_tokens(source_tokens), y_labels=visible_tokens(ys),
                   xlabel="source", ylabel="target", title=title, path=path, annotate=False)


def line_chart(series: Mapping[str, Sequence[float]], categories: Sequence[str], *, xlabel: str, ylabel: str,
               path: str | Path, title: str | None = None) -> Path:
    """One line per named series over ``categories`` (e.g. BLEU per length bucket per model), saved to ``path``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in series.items():
        if len(values) != len(categories):
            raise ValueError(f"series {name!r} has {len(values)} values for {len(categories)} categories")
        ax.plot(list(categories), list(values), marker="o", label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    return save_figure(fig, path, dpi=150)


def _rows(n: int, height: float):
    plt = _pyplot()
    fig, axes = plt.subplots(n, 1, figsize=(7.0, height * n + 0.6), squeeze=False)
    return fig, axes[:, 0]


def _columns(n: int, width: float, height: float):
    plt = _pyplot()
    fig, axes = plt.subplots(1, n, figsize=(width * n, height), squeeze=False)
    return fig, axes[0]


def image_attention(image: Tensor, prefix: str | Path, *, caption: str, spatial: Mapping[str, Tensor] | None = None,
                    channel: Mapping[str, Tensor] | None = None, branches: Mapping[str, Tensor] | None = None,
                    branch_labels: Mapping[str, Sequence[str]] | None = None,
                    non_local: Mapping[str, Tensor] | None = None,
                    grids: Mapping[str, tuple[tuple[int, int], tuple[int, int]]] | None = None,
                    query_pixel: tuple[int, int] | None = None) -> list[Path]:
    """Draw one image's attention maps into ``PREFIX-spatial.png``, ``-channel.png``, ``-sk.png`` and
    ``-nonlocal.png`` (each only when there are such maps); returns the paths written.

    Args:
        image: ``(H, W)`` in [0, 1].  caption: the title of every picture (e.g. the prediction).
        spatial: ``{name: (h, w)}`` maps, upsampled over the image.  channel: ``{name: (C,)}`` weights.
        branches: ``{name: (M, C)}`` SK branch weights, with ``branch_labels[name]`` (one per branch).
        non_local: ``{name: (h*w, h'*w')}`` weights, with ``grids[name] = ((h, w), (h', w'))`` the query and key
            grids; the row of ``query_pixel`` ``(y, x)`` in input pixels (default: the centre) is drawn.
    """
    spatial, channel, branches, non_local = spatial or {}, channel or {}, branches or {}, non_local or {}
    branch_labels, grids = branch_labels or {}, grids or {}
    prefix = Path(prefix)
    size = tuple(image.shape[-2:])
    qy, qx = query_pixel if query_pixel is not None else (size[0] // 2, size[1] // 2)
    paths: list[Path] = []

    def done(fig, kind: str) -> None:
        fig.suptitle(caption, fontsize=10)
        paths.append(save_figure(fig, prefix.with_name(f"{prefix.name}-{kind}.png")))

    if spatial:
        fig, axes = _columns(len(spatial) + 1, 2.9, 3.0)
        axes[0].imshow(image.numpy(), cmap="gray")
        axes[0].set_title("input", fontsize=9)
        axes[0].axis("off")
        for ax, (key, m) in zip(axes[1:], spatial.items(), strict=True):
            overlay(image, m, ax=ax, title=f"{key} ({m.shape[-2]}x{m.shape[-1]}): {float(m.min()):.2f} to "
                    f"{float(m.max()):.2f}")
        done(fig, "spatial")
    if channel:
        fig, axes = _rows(len(channel), 2.0)
        for ax, (key, m) in zip(axes, channel.items(), strict=True):
            channel_bars(m, ax=ax)
            ax.set_title(f"{key}: {ax.get_title()}", fontsize=9)
        done(fig, "channel")
    if branches:
        fig, axes = _rows(len(branches), 1.6)
        for ax, (key, m) in zip(axes, branches.items(), strict=True):
            branch_weights(m, labels=branch_labels.get(key), ax=ax, title=f"{key}: weight per channel")
        done(fig, "sk")
    if non_local:
        fig, axes = _columns(len(non_local), 3.3, 3.2)
        for ax, (key, m) in zip(axes, non_local.items(), strict=True):
            (h, w), keys = grids[key]
            row = m[(qy * h // size[0]) * w + qx * w // size[1]]
            query_map(image, row, (qy, qx), key_shape=keys, ax=ax, title=f"{key}: query ({qy}, {qx})")
        done(fig, "nonlocal")
    return paths
