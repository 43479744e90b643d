"""Pictures of attention (matplotlib, from the ``viz`` extra). Functions take plain tensors or arrays.

- :func:`heatmap`: weights or an alignment, queries by keys, with token labels (CJK fonts where installed).
- :mod:`qkv.viz.text`: words shaded by attention weight, in a terminal (ANSI) or a self-contained HTML page.
- :mod:`qkv.viz.vision`: spatial maps over images, channel and branch weights, a non-local query pixel.
"""

from .heatmap import heatmap
from .text import HighlightedText, highlight_ansi, render_html, save_html

__all__ = ["heatmap", "HighlightedText", "highlight_ansi", "render_html", "save_html"]
