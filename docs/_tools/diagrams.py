"""The concept pages' diagrams, drawn with matplotlib as SVG while the site is built (``hooks.py``).

- ``concepts/stages.svg``: the three stages of attention: a query scores every key, the scores are normalised
  into weights, and the weights sum the values.
- ``concepts/context.svg``: one step of an encoder-decoder with attention: the decoder's state asks, every
  encoder vector answers with a weight, and their weighted sum is the context of this step.
- ``concepts/se-cbam.svg``: a Squeeze-and-Excitation block and a CBAM block, with the shape at every step.

Run as a script (``python docs/_tools/diagrams.py DIR``) it writes the three files into ``DIR`` to look at them.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

# colours of the three stages, and of keys, values and queries (matplotlib's tab palette, light)
STAGE = ("#e8eefc", "#fdf1e1", "#e7f5e9")
KEY, VALUE, QUERY, OP = "#c9d7f8", "#cdeccf", "#f9d9b5", "#ffffff"
INK = "#263238"


def _figure(width: float, height: float, units: tuple[float, float]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "qkv", "font.size": 11, "mathtext.fontset": "stix",
                         "text.color": INK, "axes.unicode_minus": False})
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, units[0])
    ax.set_ylim(0, units[1])
    ax.axis("off")
    return fig, ax


def _svg(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", facecolor="white", metadata={"Date": None})
    plt.close(fig)
    return buf.getvalue()


def _box(ax, x, y, w, h, text, color, size=11, **kw):
    """A rounded box centred on (x, y)."""
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02,rounding_size=0.12",
                                fc=color, ec=INK, lw=1.0, zorder=3))
    ax.text(x, y, text, ha="center", va="center", fontsize=size, zorder=4, **kw)


def _circle(ax, x, y, r, text, size=14):
    from matplotlib.patches import Circle

    ax.add_patch(Circle((x, y), r, fc=OP, ec=INK, lw=1.0, zorder=3))
    ax.text(x, y, text, ha="center", va="center", fontsize=size, zorder=4)


def _arrow(ax, a, b, lw=1.2, color=INK, style="-|>", ls="-", shrink=0.0, **kw):
    ax.annotate("", xy=b, xytext=a, zorder=2, arrowprops=dict(arrowstyle=style, lw=lw, color=color, ls=ls,
                                                              shrinkA=shrink, shrinkB=shrink, mutation_scale=12,
                                                              **kw))


def stages() -> str:
    """Query, keys and values through similarity, normalisation and the weighted sum."""
    import math

    fig, ax = _figure(9.6, 4.6, (12.0, 5.75))
    rows = [4.1, 3.15, 2.2, 1.25]
    scores = [1.5, 3.0, 0.5, 2.0]
    weights = [math.exp(s) for s in scores]
    weights = [w / sum(weights) for w in weights]
    bands = [(0.05, 5.3, "1  similarity", "a score per key"), (5.3, 7.75, "2  normalisation", "softmax: weights"),
             (7.75, 11.95, "3  weighted sum", "of the values")]
    for (x0, x1, title, note), color in zip(bands, STAGE, strict=True):
        ax.axvspan(x0, x1, ymin=0.0, ymax=0.86, color=color, zorder=0)
        ax.text((x0 + x1) / 2, 5.45, title, ha="center", va="center", fontsize=12.5, weight="bold")
        ax.text((x0 + x1) / 2, 0.35, note, ha="center", va="center", fontsize=10, style="italic")
    # the source: (key, value) pairs, the keys here and their values in stage 3
    ax.text(1.3, 4.75, "keys", ha="center", fontsize=10.5)
    for i, (y, s, a) in enumerate(zip(rows, scores, weights, strict=True), 1):
        _box(ax, 1.3, y, 1.0, 0.55, f"$k_{i}$", KEY, size=13)
        _box(ax, 3.7, y, 1.4, 0.55, f"$f(q, k_{i})$", OP, size=12)
        _arrow(ax, (1.8, y), (2.98, y))
        ax.text(5.1, y + 0.12, f"$s_{i}={s:g}$", ha="center", va="bottom", fontsize=11)
        _arrow(ax, (4.42, y), (5.95, y))
        ax.text(7.25, y + 0.12, f"$a_{i}={a:.2f}$", ha="center", va="bottom", fontsize=11)
        _arrow(ax, (6.75, y), (7.95, y), lw=0.8 + 5 * a)
        _box(ax, 8.45, y, 1.0, 0.55, f"$v_{i}$", VALUE, size=13)
        _arrow(ax, (8.95, y), (10.35, 2.65), lw=0.8 + 5 * a, shrink=2)
    ax.text(8.45, 4.75, "values", ha="center", fontsize=10.5)
    # the query enters every similarity box from above (drawn behind them)
    ax.plot([3.7, 3.7], [4.55, 1.25], color="#b26a00", lw=1.6, ls=(0, (4, 2)), zorder=1)
    _box(ax, 3.7, 4.75, 0.9, 0.42, "$q$", QUERY, size=13)
    ax.text(3.7, 5.05, "query", ha="center", va="bottom", fontsize=10.5)
    _box(ax, 6.35, 2.675, 0.8, 3.35, "softmax", OP, size=11, rotation=90)
    _circle(ax, 10.65, 2.65, 0.33, r"$\Sigma$")
    _arrow(ax, (10.98, 2.65), (11.45, 2.65))
    ax.text(11.5, 2.65, "output", ha="left", va="center", fontsize=10.5, rotation=90)
    ax.text(10.65, 1.95, r"$\Sigma_i\, a_i v_i$", ha="center", va="top", fontsize=12)
    return _svg(fig)


def context() -> str:
    """One decoder step: the context C_i as the weighted sum of the encoder's vectors."""
    fig, ax = _figure(9.6, 4.8, (12.0, 6.0))
    words, weights = ["Tom", "chase", "Jerry"], [0.2, 0.7, 0.1]
    xs = [1.5, 3.6, 5.7]
    ax.text(6.45, 1.45, "encoder: keys\nand values", ha="left", va="center", fontsize=10.5, style="italic")
    ax.text(8.95, 5.4, "decoder", ha="center", va="bottom", fontsize=10.5, style="italic")
    for j, (x, word, a) in enumerate(zip(xs, words, weights, strict=True), 1):
        ax.text(x, 0.3, f"“{word}”", ha="center", va="center", fontsize=11.5)
        _arrow(ax, (x, 0.55), (x, 1.1))
        _box(ax, x, 1.45, 1.2, 0.62, f"$h_{j}$", KEY, size=13)
        _arrow(ax, (x, 1.8), (3.6 + (x - 3.6) * 0.18, 3.35), lw=0.8 + 7 * a, shrink=2)
        mid = x + (3.6 - x) * 0.5
        ax.text(mid + {1: -0.4, 2: 0.25, 3: 0.4}[j], 2.5, f"$a_{{i{j}}}={a:g}$", ha="right" if j == 1 else "left",
                va="center", fontsize=11.5)
    for x0, x1 in zip(xs, xs[1:], strict=False):
        _arrow(ax, (x0 + 0.62, 1.45), (x1 - 0.62, 1.45), style="<|-|>")
    _circle(ax, 3.6, 3.75, 0.4, r"$\Sigma$")
    ax.text(3.6, 4.35, r"context $C_i = \sum_j a_{ij} h_j$", ha="center", va="bottom", fontsize=12)
    # the decoder: the previous state asks (the query), the new state reads C_i
    _box(ax, 7.6, 4.9, 1.3, 0.62, "$s_{i-1}$", QUERY, size=13)
    _box(ax, 10.3, 4.9, 1.3, 0.62, "$s_i$", QUERY, size=13)
    _arrow(ax, (8.25, 4.9), (9.65, 4.9))
    _arrow(ax, (4.0, 3.75), (9.75, 4.58), lw=1.8)
    _arrow(ax, (10.3, 5.21), (10.3, 5.65))
    ax.text(10.3, 5.72, "$y_i$, the next word", ha="center", va="bottom", fontsize=11)
    ax.text(9.0, 3.2, "$y_{i-1}$", ha="center", va="center", fontsize=11)
    _arrow(ax, (9.25, 3.35), (10.1, 4.58))
    _arrow(ax, (7.4, 4.58), (6.35, 1.95), ls=(0, (4, 2)), color="#b26a00", lw=1.4)
    ax.text(7.05, 2.45, "the query $s_{i-1}$ scores\nevery key $h_j$; a softmax\nmakes the weights $a_{ij}$",
            ha="left", va="center", fontsize=10.5, color="#8a5200")
    return _svg(fig)


def _cuboid(ax, x, y, w, h, d, color, label=None, size=10, above=False):
    """A feature map as a box seen from the front-right: front face (w x h) at (x, y), depth d up-right."""
    import matplotlib.colors as mc
    from matplotlib.patches import Polygon

    k = 0.55
    front = [(x, y), (x + w, y), (x + w, y + h), (x, y + h)]
    top = [(x, y + h), (x + w, y + h), (x + w + d * k, y + h + d * k), (x + d * k, y + h + d * k)]
    side = [(x + w, y), (x + w + d * k, y + d * k), (x + w + d * k, y + h + d * k), (x + w, y + h)]
    r, g, b = mc.to_rgb(color)
    for poly, shade in ((side, 0.82), (top, 0.92), (front, 1.0)):
        ax.add_patch(Polygon(poly, closed=True, fc=(r * shade, g * shade, b * shade), ec=INK, lw=0.8, zorder=3))
    if label and above:
        ax.text(x + (w + d * k) / 2, y + h + d * k + 0.1, label, ha="center", va="bottom", fontsize=size)
    elif label:
        ax.text(x + (w + d * k) / 2, y - 0.12, label, ha="center", va="top", fontsize=size)
    return (x + w + d * k, y + (h + d * k) / 2)


def _skip(ax, x0, y0, x1, y1, low=-0.95):
    """The feature map carried around a gate: down from (x0, y0), along, and up into (x1, y1)."""
    ax.plot([x0, x0, x1], [y0, y0 + low, y0 + low], color="#607d8b", lw=1.0, zorder=1)
    _arrow(ax, (x1, y0 + low), (x1, y1), lw=1.0, color="#607d8b")


def se_cbam() -> str:
    """SE: squeeze, excite, scale. CBAM: a channel gate, then a spatial gate."""
    fig, ax = _figure(10.4, 5.6, (13.0, 7.0))
    fx = "#dfe6f3"
    ax.text(0.1, 6.7, "Squeeze-and-Excitation", ha="left", va="center", fontsize=12.5, weight="bold")
    # SE row: X -> pool -> FC, ReLU -> FC, sigmoid -> weights -> scale X
    y = 4.7
    _cuboid(ax, 0.3, y - 0.2, 0.45, 1.1, 0.9, fx, r"$X$: $C{\times}H{\times}W$")
    _arrow(ax, (1.3, y + 0.55), (1.9, y + 0.55))
    _box(ax, 2.55, y + 0.55, 1.2, 0.75, "global\naverage pool", OP, size=9.5)
    _arrow(ax, (3.15, y + 0.55), (3.55, y + 0.55))
    _cuboid(ax, 3.6, y + 0.2, 0.12, 0.12, 0.9, "#f3e0c4", r"$C{\times}1{\times}1$")
    _arrow(ax, (4.3, y + 0.55), (4.65, y + 0.55))
    _box(ax, 5.35, y + 0.55, 1.3, 0.75, "FC $C/r$\nReLU", OP, size=9.5)
    _arrow(ax, (6.0, y + 0.55), (6.35, y + 0.55))
    _box(ax, 7.05, y + 0.55, 1.3, 0.75, "FC $C$\nsigmoid", OP, size=9.5)
    _arrow(ax, (7.7, y + 0.55), (8.05, y + 0.55))
    _cuboid(ax, 8.1, y + 0.2, 0.12, 0.12, 0.9, "#f6c58e", "a weight\nper channel", size=9.5)
    _arrow(ax, (8.75, y + 0.55), (9.35, y + 0.55))
    _circle(ax, 9.6, y + 0.55, 0.25, r"$\times$", size=13)
    ax.annotate("", xy=(9.6, y + 0.82), xytext=(0.75, y + 1.45), zorder=1,
                arrowprops=dict(arrowstyle="-|>", lw=1.0, color="#607d8b", connectionstyle="angle,angleA=0,angleB=90",
                                mutation_scale=12))
    _arrow(ax, (9.85, y + 0.55), (10.4, y + 0.55))
    _cuboid(ax, 10.5, y - 0.2, 0.45, 1.1, 0.9, "#c9d7f8", r"$\tilde X$: $C{\times}H{\times}W$")
    ax.text(12.9, y + 0.55, "squeeze, excite,\nscale", ha="right", va="center", fontsize=9.5, style="italic")
    # CBAM row: F -> channel attention (avg & max pool -> shared MLP -> + -> sigmoid) x F -> spatial attention
    ax.text(0.1, 3.35, "CBAM", ha="left", va="center", fontsize=12.5, weight="bold")
    y = 1.3
    _cuboid(ax, 0.3, y - 0.2, 0.45, 1.1, 0.9, fx, r"$F$: $C{\times}H{\times}W$", above=True)
    _arrow(ax, (1.3, y + 0.55), (1.6, y + 1.0))
    _arrow(ax, (1.3, y + 0.55), (1.6, y + 0.1))
    _box(ax, 2.2, y + 1.05, 1.15, 0.5, "avg pool", OP, size=9.5)
    _box(ax, 2.2, y + 0.05, 1.15, 0.5, "max pool", OP, size=9.5)
    _arrow(ax, (2.8, y + 1.05), (3.2, y + 0.7))
    _arrow(ax, (2.8, y + 0.05), (3.2, y + 0.4))
    _box(ax, 3.85, y + 0.55, 1.2, 0.75, "shared\nMLP, +, σ", OP, size=9.5)
    _module(ax, 1.5, y, "channel attention $M_c$: $C{\\times}1{\\times}1$", "#3f51b5", 0.52)
    _arrow(ax, (5.45, y + 0.55), (5.8, y + 0.55))
    _cuboid(ax, 5.85, y - 0.2, 0.45, 1.1, 0.9, "#c9d7f8", "F′", above=True)
    _arrow(ax, (6.85, y + 0.55), (7.3, y + 0.55))
    _box(ax, 8.0, y + 0.55, 1.3, 0.75, "avg & max\nover channels", OP, size=9.5)
    _arrow(ax, (8.65, y + 0.55), (8.95, y + 0.55))
    _box(ax, 9.6, y + 0.55, 1.2, 0.75, "7×7 conv\nsigmoid", OP, size=9.5)
    _module(ax, 7.2, y, "spatial attention $M_s$: $1{\\times}H{\\times}W$", "#2e7d32", 6.07)
    _arrow(ax, (11.15, y + 0.55), (11.45, y + 0.55))
    _cuboid(ax, 11.5, y - 0.2, 0.45, 1.1, 0.9, "#b9e4bd", "F″", above=True)
    return _svg(fig)


def _module(ax, x: float, y: float, label: str, colour: str, skip_from: float) -> None:
    """One of CBAM's two attention modules: a dashed frame 3.1 wide from ``x`` with its ``label`` above, then the
    product of its map with the features that skip around it from ``skip_from``."""
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, y - 0.55), 3.1, 2.45, fc="none", ec=colour, lw=1.0, ls=(0, (3, 2)), zorder=1))
    ax.text(x + 1.55, y + 2.0, label, ha="center", va="bottom", fontsize=9.5, color=colour)
    _arrow(ax, (x + 2.95, y + 0.55), (x + 3.45, y + 0.55))
    _circle(ax, x + 3.7, y + 0.55, 0.25, r"$\times$", size=13)
    _skip(ax, skip_from, y - 0.2, x + 3.7, y + 0.3)


DIAGRAMS = {"concepts/stages.svg": stages, "concepts/context.svg": context, "concepts/se-cbam.svg": se_cbam}


def all_diagrams() -> dict[str, str]:
    """Every diagram, by its path in the site."""
    return {uri: draw() for uri, draw in DIAGRAMS.items()}


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    for uri, svg in all_diagrams().items():
        path = out / Path(uri).name
        path.write_text(svg, encoding="utf-8")
        print(path)
