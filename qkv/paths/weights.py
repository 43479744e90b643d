"""The paths that build the weights ``(..., Tq, Tk)``: the dot family's weights path and the reference path.

- :func:`dot_weights`: one matmul of the scaled ``q'`` with ``k'``, a masked softmax written over the scores (no
  second ``(..., Tq, Tk)`` tensor), one matmul with the values; taken when weights are asked for.
- :func:`reference`: the three stages as written, :func:`~qkv.paths.common.scaled_scores` ->
  :func:`~qkv.paths.common.masked_normalize` -> dropout -> weighted sum: every score, every normaliser.
"""

from __future__ import annotations

from torch import Tensor

from .common import finish, masked_normalize, scaled_scores, work_dtype

__all__ = ["dot_weights", "reference"]


def dot_weights(q: Tensor, k: Tensor, value: Tensor, allowed: Tensor | None, bias: Tensor | None, normalizer,
                dropout: float, factor: float, return_weights: bool, out_dtype):
    """``softmax(q k^T * factor)`` (masked) ``@ value`` from the dot form ``q (..., Tq, D)``, ``k (..., Tk, D)``;
    the scale is applied to ``q`` before the matmul. Weights in ``out_dtype``."""
    work = work_dtype(q)
    q, k = q.to(work), k.to(work)
    scores = (q * factor) @ k.transpose(-2, -1)
    weights = masked_normalize(scores, allowed, bias, normalizer, inplace=True).to(out_dtype)
    return finish(weights, value, dropout, return_weights)


def reference(sc, query: Tensor, key: Tensor, value: Tensor, allowed: Tensor | None, bias: Tensor | None,
              normalizer, dropout: float, scale: float | None, key_prepared: bool, return_weights: bool):
    """The three stages, for any score and normaliser."""
    scores = scaled_scores(sc, query, key, scale, key_prepared)
    weights = masked_normalize(scores, allowed, bias, normalizer, inplace=False).to(query.dtype)
    return finish(weights, value, dropout, return_weights)
