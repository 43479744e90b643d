"""The picture of a speech recogniser's alignment (Chorowski et al., 2015, Fig. 2; Chan et al., 2016, Fig. 2): the
log-mel spectrogram, and under it, on the same time axis, each output character's attention over the listener's
frames; for a hybrid model the CTC alignment beside it (the posterior of every character over the frames, blank
left out). A monotonic diagonal is a model that reads the audio in order; a broken one is a model that lost its
place (matplotlib, the ``viz`` extra).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from torch import Tensor

from ...viz.files import save_figure
from ...viz.heatmap import _pyplot
from ...viz.plots import visible_tokens

__all__ = ["speech_alignment"]

_HOP_S = 0.01  #: seconds between feature frames (qkv.apps.speech.audio.log_mel's default)


def speech_alignment(features: Tensor, tokens: Sequence[str], attention: Tensor | None = None, *,
                     ctc: Tensor | None = None, vocab: Sequence[str] | None = None, blank: int = 0,
                     title: str | None = None, path: str | Path | None = None):
    """Draw ``features (F, M)`` (log-mel, frames every 10 ms) and, under it, ``attention (T, S)`` (a row per
    output character, ``<eos>`` last when there is one more row than ``tokens``) over ``S`` listener frames, on the
    same time axis; ``ctc (S, V)`` (log-probabilities; ``vocab`` names its columns) adds a panel of the CTC
    posteriors of the characters that are likely somewhere (blank left out). Returns the saved path (``path``) or
    the figure."""
    import numpy as np

    if features.dim() != 2:
        raise ValueError(f"features must be (F, M), got {tuple(features.shape)}")
    if attention is None and ctc is None:
        raise ValueError("nothing to draw beside the spectrogram: give attention (T, S) or ctc (S, V)")
    rows = list(tokens)
    if attention is not None:
        if attention.dim() != 2 or attention.shape[0] not in (len(rows), len(rows) + 1):
            raise ValueError(f"attention must be (T, S) with T = {len(rows)} characters (or one more for the end), "
                             f"got {tuple(attention.shape)}")
        rows = rows + ["<eos>"] * (attention.shape[0] - len(rows))
    if ctc is not None and (ctc.dim() != 2 or (vocab is not None and len(vocab) != ctc.shape[1])):
        raise ValueError(f"ctc must be (S, V) with V = len(vocab), got {tuple(ctc.shape)}")
    seconds = features.shape[0] * _HOP_S
    panels = 1 + (attention is not None) + (ctc is not None)
    heights = [1.2] + ([min(4.0, max(1.2, 0.1 * len(rows)))] if attention is not None else []) + \
        ([1.6] if ctc is not None else [])
    plt = _pyplot()
    fig, axes = plt.subplots(panels, 1, figsize=(9, 1.0 + 1.3 * sum(heights)), sharex=True,
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    axes = axes[:, 0]
    axes[0].imshow(features.float().cpu().numpy().T, origin="lower", aspect="auto", cmap="magma",
                   extent=(0, seconds, 0, features.shape[1]))
    axes[0].set_ylabel("mel")
    axes[0].set_title(title or "log-mel spectrogram", fontsize=10)
    k = 1
    if attention is not None:
        a = attention.float().cpu().numpy()
        ax = axes[k]
        ax.imshow(a, aspect="auto", cmap="viridis", interpolation="nearest", vmin=0.0,
                  extent=(0, seconds, len(rows) - 0.5, -0.5))
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(visible_tokens(rows), fontsize=7 if len(rows) < 40 else 5)
        ax.set_ylabel("output")
        k += 1
    if ctc is not None:
        p = ctc.float().cpu().exp().numpy()
        keep = [v for v in range(p.shape[1]) if v != blank and p[:, v].max() > 0.1]
        names = [vocab[v] if vocab is not None else str(v) for v in keep] or ["(none)"]
        grid = p[:, keep].T if keep else np.zeros((1, p.shape[0]))
        ax = axes[k]
        ax.imshow(grid, aspect="auto", cmap="Greys", interpolation="nearest", vmin=0.0, vmax=1.0,
                  extent=(0, seconds, len(names) - 0.5, -0.5))
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(visible_tokens(names), fontsize=7)
        ax.set_ylabel("CTC")
    axes[-1].set_xlabel("seconds")
    if path is None:
        return fig
    return save_figure(fig, path)
