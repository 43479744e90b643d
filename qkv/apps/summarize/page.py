"""What a pointer-generator copied: each output word coloured by ``p_gen`` (generated from the vocabulary or copied
from the source), its attention over the source, and the coverage over the source after the last step.

- :func:`render_copy_page` / :func:`save_copy_page`: a self-contained HTML page (no network, no external files):
  output words shaded from blue (``p_gen`` = 1, generated) to orange (``p_gen`` = 0, copied); pointing at (or
  tabbing to) a word shades the source by that word's attention; the last row is the coverage. Every text goes
  through :func:`html.escape` and the numbers through :mod:`json`, so input text cannot inject markup.
- :func:`copy_figure`: the same as a matplotlib picture: the attention matrix (one row per output word, its label
  coloured by ``p_gen``), a ``p_gen`` bar beside it and the coverage below.

Example::

    item = CopyView(["the", "tool", "frobz", "runs"], ["frobz", "tool"], attention, p_gen, coverage)
    save_copy_page("copy.html", [item])
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["CopyView", "render_copy_page", "save_copy_page", "copy_figure", "pgen_colour"]


@dataclass
class CopyView:
    """One output to show: ``source`` words (S), ``output`` words (T), ``attention (T or T + 1, S)`` (a row per
    output word, maybe one more for the end token), ``p_gen (T or T + 1,)``, ``coverage (S,)`` and a caption."""

    source: Sequence[str]
    output: Sequence[str]
    attention: Tensor
    p_gen: Tensor
    coverage: Tensor
    caption: str = ""

    def __post_init__(self):
        self.attention = torch.as_tensor(self.attention).detach().float().cpu()
        self.p_gen = torch.as_tensor(self.p_gen).detach().float().cpu().reshape(-1)
        self.coverage = torch.as_tensor(self.coverage).detach().float().cpu().reshape(-1)
        s, t = len(self.source), len(self.output)
        if self.attention.dim() != 2 or self.attention.shape[1] != s or self.attention.shape[0] < t:
            raise ValueError(f"attention must be (T >= {t}, S = {s}), got {tuple(self.attention.shape)}")
        if self.p_gen.shape[0] < t or self.coverage.shape[0] != s:
            raise ValueError(f"p_gen must have {t} values and coverage {s}, got {self.p_gen.shape[0]} and "
                             f"{self.coverage.shape[0]}")


def pgen_colour(p_gen: float) -> tuple[int, int, int]:
    """RGB between orange (``p_gen`` 0: copied) and blue (``p_gen`` 1: generated)."""
    p = min(1.0, max(0.0, float(p_gen)))
    copied, generated = (240, 120, 20), (40, 110, 220)
    return tuple(round(c + (g - c) * p) for c, g in zip(copied, generated, strict=True))  # type: ignore[return-value]


_STYLE = """body{font-family:sans-serif;max-width:60em;margin:2em auto;line-height:1.9}
.w{padding:1px 3px;border-radius:3px;margin:0 1px;cursor:pointer}.out .w{color:white}
.item{border-bottom:1px solid #ccc;padding:1em 0}.lab{color:#555;font-size:85%}
.key span{padding:1px 6px;border-radius:3px;color:white}"""
_SCRIPT = """function shade(row, weights){const top=Math.max(...weights,1e-9);
row.querySelectorAll('.w').forEach((s,i)=>{const a=weights[i]/top;
s.style.background=`rgba(255,120,0,${a.toFixed(3)})`;s.title=`attention ${weights[i].toFixed(3)}`;});}
document.querySelectorAll('.item').forEach(item=>{const src=item.querySelector('.src');
const attn=JSON.parse(item.dataset.attn);
item.querySelectorAll('.out .w').forEach((w,t)=>{const show=()=>shade(src,attn[t]);
w.addEventListener('mouseenter',show);w.addEventListener('focus',show);});
shade(item.querySelector('.cov'),JSON.parse(item.dataset.cov));if(attn.length)shade(src,attn[0]);});"""


def _words(tokens: Sequence[str], cls: str, colours: Sequence[tuple[int, int, int]] | None = None,
           titles: Sequence[str] | None = None) -> str:
    spans = []
    for i, tok in enumerate(tokens):
        style = f' style="background:rgb{colours[i]}"' if colours else ""
        title = f' title="{html.escape(titles[i])}"' if titles else ""
        spans.append(f'<span class="w" tabindex="0"{style}{title}>{html.escape(str(tok))}</span>')
    return f'<div class="{cls}">{" ".join(spans)}</div>'


def render_copy_page(items: Sequence[CopyView], *, title: str = "What the summariser copied") -> str:
    """The HTML page of ``items`` (see the module docstring)."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
             f"<p class='key'>Output words: <span style='background:rgb{pgen_colour(1)}'>generated (p_gen 1)"
             f"</span> &hellip; <span style='background:rgb{pgen_colour(0)}'>copied (p_gen 0)</span>. Point at a "
             "word to see its attention over the source; the last row is the coverage after the last step.</p>"]
    for item in items:
        t = len(item.output)
        p = item.p_gen[:t].tolist()
        attn = [[round(x, 5) for x in row] for row in item.attention[:t].tolist()]
        cov = [round(x, 5) for x in item.coverage.tolist()]
        parts.append(f"<div class='item' data-attn='{html.escape(json.dumps(attn))}' "
                     f"data-cov='{html.escape(json.dumps(cov))}'>")
        if item.caption:
            parts.append(f"<p><b>{html.escape(item.caption)}</b></p>")
        parts.append("<div class='lab'>output (colour: p_gen)</div>")
        parts.append(_words(item.output, "out", [pgen_colour(x) for x in p], [f"p_gen {x:.3f}" for x in p]))
        parts.append("<div class='lab'>source (shade: attention of the word pointed at)</div>")
        parts.append(_words(item.source, "src"))
        parts.append("<div class='lab'>coverage after the last step</div>")
        parts.append(_words(item.source, "cov"))
        parts.append("</div>")
    parts.append(f"<script>{_SCRIPT}</script></body></html>")
    return "\n".join(parts)


def save_copy_page(path: str | os.PathLike, items: Sequence[CopyView], *,
                   title: str = "What the summariser copied") -> Path:
    """Write :func:`render_copy_page` to ``path`` (``.html`` added when it has no extension); the file written."""
    from ...viz.files import page_path, write_atomic

    return write_atomic(page_path(path, option="--html"), render_copy_page(items, title=title), option="--html")


def copy_figure(item: CopyView, path: str | os.PathLike | None = None, *, max_source: int = 60):
    """A matplotlib figure of one :class:`CopyView`: attention rows labelled by output words coloured by ``p_gen``,
    a ``p_gen`` bar on the right and the coverage under the matrix (the first ``max_source`` source words).
    Saved to ``path`` when given; returns the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t, s = len(item.output), min(len(item.source), max_source)
    attn = item.attention[:t, :s].numpy()
    fig = plt.figure(figsize=(max(6.0, 0.22 * s + 2), 0.3 * t + 3.2), layout="constrained")
    grid = fig.add_gridspec(2, 2, width_ratios=(20, 1), height_ratios=(max(t, 1), 1.2))
    ax = fig.add_subplot(grid[0, 0])
    ax.imshow(attn, aspect="auto", cmap="Oranges", vmin=0)
    ax.set_yticks(range(t), item.output, fontsize=8)
    for label, p in zip(ax.get_yticklabels(), item.p_gen[:t].tolist(), strict=True):
        label.set_color([c / 255 for c in pgen_colour(p)])
    ax.tick_params(labelbottom=False, bottom=False)
    ax.set_title(item.caption or "attention of each output word (label colour: p_gen, blue generated, orange "
                 "copied)", fontsize=9)
    bar = fig.add_subplot(grid[0, 1], sharey=ax)
    bar.barh(range(t), item.p_gen[:t].numpy(), color=[[c / 255 for c in pgen_colour(p)]
                                                      for p in item.p_gen[:t].tolist()])
    bar.set_xlim(0, 1)
    bar.set_xticks([0, 1])
    bar.tick_params(labelleft=False, labelsize=7)
    bar.set_xlabel("p_gen", fontsize=8)
    cov = fig.add_subplot(grid[1, 0], sharex=ax)
    cov.imshow(item.coverage[:s].numpy()[None], aspect="auto", cmap="Greens", vmin=0)
    cov.set_yticks([0], ["coverage"], fontsize=8)
    cov.set_xticks(range(s), list(item.source)[:s], rotation=90, fontsize=7)
    if path is not None:  # constrained layout, not save_figure's tight_layout
        import io

        from ...viz.files import picture_path, write_atomic

        target = picture_path(path)
        buf = io.BytesIO()
        fig.savefig(buf, format=target.suffix[1:].lower(), dpi=110)
        write_atomic(target, buf.getvalue())
    return fig
