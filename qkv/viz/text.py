"""Words shaded by attention weight: ANSI colours for a terminal, and a self-contained HTML page.

Weights are shown relative to the sentence's largest weight (the most attended word is fully shaded); the
exact weight of every word is in the page's tooltips. All text written into HTML goes through
:func:`html.escape`, so input text cannot inject markup or scripts.

Example::

    print(highlight_ansi(["a", "great", "film"], [0.1, 0.8, 0.1]))
    page = render_html([HighlightedText(["a", "great", "film"], [0.1, 0.8, 0.1], caption="positive 0.97")])
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["HighlightedText", "relative_weights", "highlight_ansi", "render_html", "save_html", "top_tokens"]

# shading colour at full weight (RGB); lighter shades mix it with white
SHADE = (255, 120, 0)


@dataclass
class HighlightedText:
    """One text to show: its ``tokens``, one attention weight per token, and a caption (e.g. label and probability).

    ``details`` are extra ``(name, value)`` pairs shown under the caption (e.g. every class probability).
    """

    tokens: Sequence[str]
    weights: Sequence[float]
    caption: str = ""
    details: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self):
        self.weights = _as_floats(self.weights)
        self.tokens = [str(t) for t in self.tokens]
        if len(self.tokens) != len(self.weights):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.weights)} weights")


def _as_floats(weights) -> list[float]:
    if hasattr(weights, "detach"):
        weights = weights.detach().cpu()
    if hasattr(weights, "tolist"):
        weights = weights.tolist()
    out = list(weights)
    if out and isinstance(out[0], list | tuple):
        raise ValueError("weights must be one number per token (average the hops of a multi-hop model first)")
    return [float(w) for w in out]


def relative_weights(weights: Sequence[float]) -> list[float]:
    """``weights / max(weights)``, in [0, 1] (all zeros stay zero)."""
    w = _as_floats(weights)
    top = max(w, default=0.0)
    return [max(0.0, x) / top if top > 0 else 0.0 for x in w]


def _shade(a: float) -> tuple[int, int, int]:
    return tuple(round(255 + (c - 255) * a) for c in SHADE)


def top_tokens(tokens: Sequence[str], weights: Sequence[float], k: int = 3) -> list[tuple[str, float]]:
    """The ``k`` tokens with the largest weights, largest first."""
    w = _as_floats(weights)
    order = sorted(range(len(w)), key=lambda i: -w[i])[:k]
    return [(tokens[i], w[i]) for i in order]


def highlight_ansi(tokens: Sequence[str], weights: Sequence[float], *, color: bool = True,
                   threshold: float = 0.05) -> str:
    """The tokens joined by spaces, each on a background as strong as its relative weight (24-bit ANSI colours).

    Tokens below ``threshold`` of the largest weight are left plain. ``color=False`` gives the plain text.
    """
    item = HighlightedText(tokens, weights)
    if not color:
        return " ".join(item.tokens)
    parts = []
    for tok, a in zip(item.tokens, relative_weights(item.weights), strict=True):
        if a < threshold:
            parts.append(tok)
            continue
        r, g, b = _shade(a)
        bold = "1;" if a >= 0.999 else ""
        parts.append(f"\x1b[{bold}48;2;{r};{g};{b}m\x1b[38;2;0;0;0m{tok}\x1b[0m")
    return " ".join(parts)


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em; max-width: 60em; color: #222; }
h1 { font-size: 1.3em; }
.item { margin: 0 0 1.2em 0; padding: 0.6em 0.8em; border-left: 4px solid #ddd; }
.caption { font-size: 0.9em; color: #555; margin-bottom: 0.3em; }
.text { line-height: 2.0; font-size: 1.1em; }
.tok { padding: 0.15em 0.2em; border-radius: 0.2em; }
.legend { font-size: 0.85em; color: #555; margin-bottom: 1.5em; }
"""


def render_html(items: Sequence[HighlightedText], *, title: str = "Attention over words") -> str:
    """A complete HTML page (inline CSS, no scripts, no external files) with every item's words shaded."""
    esc = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           f"<title>{esc(title)}</title>", f"<style>{_CSS}</style>", "</head>", "<body>", f"<h1>{esc(title)}</h1>",
           '<p class="legend">Each word is shaded by its attention weight, relative to the most attended word of '
           "its sentence; hover over a word for its weight.</p>"]
    for n, item in enumerate(items, 1):
        if not isinstance(item, HighlightedText):
            raise TypeError(f"items must be HighlightedText, got {type(item).__name__}")
        out.append('<div class="item">')
        caption = f"{n}. {item.caption}" if item.caption else f"{n}."
        details = "; ".join(f"{k} {v}" for k, v in item.details)
        out.append(f'<div class="caption">{esc(caption)}{esc(" (" + details + ")") if details else ""}</div>')
        spans = []
        for tok, w, a in zip(item.tokens, item.weights, relative_weights(item.weights), strict=True):
            r, g, b = _shade(a)
            spans.append(f'<span class="tok" style="background-color: rgb({r}, {g}, {b})" '
                         f'title="{w:.4f}">{esc(tok)}</span>')
        out.append(f'<div class="text">{" ".join(spans)}</div>')
        out.append("</div>")
    out += ["</body>", "</html>", ""]
    return "\n".join(out)


def save_html(path: str | os.PathLike, items: Sequence[HighlightedText], *,
              title: str = "Attention over words") -> Path:
    """Write :func:`render_html` to ``path`` (UTF-8, atomically; ``.html`` added when it has no extension); returns
    the file written."""
    from .files import page_path, write_atomic

    return write_atomic(page_path(path), render_html(items, title=title))
