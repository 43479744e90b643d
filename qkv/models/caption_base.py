"""What every captioner shares, below the models that use it: the teacher-forced result :class:`CaptionOutput` and
:func:`rows_of`, a decoding state's per-image rows taken for each caption. Re-exported by
:mod:`qkv.models.captioning`.

Axis letters: ``B`` images, ``R`` captions (rows of a teacher-forced batch), ``T`` caption positions, ``L`` grid
positions, ``V`` vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

__all__ = ["CaptionOutput", "rows_of"]


@dataclass
class CaptionOutput:
    """What a captioner's teacher-forced ``forward`` returns (weights returned, not stashed).

    ``logits (B, T, V)``; ``attention (B, T, L)``; ``beta (B, T)`` (soft model's gate, else None);
    ``sample_log_prob (B, T)`` ``log alpha_t[s_t]`` and ``entropy (B, T)`` of ``alpha_t`` (hard model in
    training, else None).
    """

    logits: Tensor
    attention: Tensor
    beta: Tensor | None = None
    sample_log_prob: Tensor | None = None
    entropy: Tensor | None = None


def rows_of(state: dict, owner: Tensor | None) -> dict:
    """A decoding state of ``B`` images with its per-image tensors taken at ``owner (R,)``, the image of each
    caption (unchanged for None): several captions of an image, the image encoded once."""
    if owner is None:
        return state
    return {k: v[owner] if isinstance(v, Tensor) else v for k, v in state.items()}
